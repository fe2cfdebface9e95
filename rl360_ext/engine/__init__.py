"""The tiny CPU reference engine that speaks SGLang's native protocol, its tokenizer, and a client."""
