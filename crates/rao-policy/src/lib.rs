//! The Burn policy: a small decoder-only transformer over the environments' tokenizer.
