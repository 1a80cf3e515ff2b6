"""The decoder families beside GPT-2 and Llama, each as its differences from Llama's blocks (transformers'
``modular_<family>.py``), and the sequence-classification heads; ``auto.py`` registers them with the Auto classes."""
