"""Meta's own Llama 3 model code (llama-models, on fairscale), verified against itself at world size 1."""
