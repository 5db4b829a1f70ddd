"""The frameworks corpus: small correct parallel programs in public frameworks' patterns."""
