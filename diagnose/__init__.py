"""The diagnosis engine: L1 pattern triage, L3 IR attribution, L4 compiler-source escalation (L2 to come)."""
