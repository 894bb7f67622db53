"""The architecture panel every backend's parity tests run (tiny presets from `hfexport.presets`):
decoder-only, sliding window (Mistral, window 4 < 8 tokens), MoE, encoder, encoder-decoder
(text and speech), vision and audio."""

PANEL = ["llama", "qwen3", "gpt2", "mistral", "qwen3_moe", "bert", "t5", "vit", "whisper", "wav2vec2"]
