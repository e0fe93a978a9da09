"""Attack tests: each surface tried as an attacker (or a hurried operator) would."""
