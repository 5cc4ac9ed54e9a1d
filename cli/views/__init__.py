"""How results look on a terminal: the renderers the commands share."""
