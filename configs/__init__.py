"""Named presets for `lsr-index encode --preset NAME` (installed as the package lsr_index.configs)."""
