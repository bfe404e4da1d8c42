"""localspec: speculative decoding on llama.cpp, for laptops and desktops."""

__version__ = "0.1.0"
