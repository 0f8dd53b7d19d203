"""The multi-head attention modules (numpy, torch) and what hooks into them."""
