"""A pretrained model's own tokenizer, read exactly: one module per part of Hugging Face's
tokenizer.json (normalizers, pre_tokenizers, bpe_model, added_tokens, post_processors,
decoders), assembled in tokenizer.py (`PretrainedTokenizer`, the "pretrained" kind);
hf_config.py reads tokenizer_config.json beside it. GGUF vocabularies:
sheepop.tokenizers.gguf_vocab.
"""
