"""Ingestion: the pattern catalog, compiler source (TableGen, C++, Python) and IR dumps into the KB stores."""
