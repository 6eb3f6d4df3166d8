"""Dense Llama/Qwen3 decoders: config, forward pass, HF loading/saving, tokenizer, test checkpoints,
and the projection modules the engine swaps in (`linear.py`: Triton kernels, `w12_linear.py`: W12
weights, `fp8_linear.py`: FP8 weights) with W12 checkpoint conversion (`convert.py`) and FP8 layouts
and conversion (`fp8_checkpoint.py`)."""
