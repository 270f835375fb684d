"""dattn inside other libraries' models: `transformers` (Hugging Face; `pip install 'dattn[hf]'`)."""
