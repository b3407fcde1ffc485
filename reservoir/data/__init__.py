"""The text a model learns from, as tokens: the corpus (TinyStories, Tiny Shakespeare, or a synthetic
one made here), its tokenizer (characters or BPE), and the token ids cached for training and evaluation."""

from reservoir.data.corpus import Corpus, DataError, load_corpus
from reservoir.data.synthetic import synthetic_stories
from reservoir.data.tokenizers import TOKENIZERS, tokenizer_hash
from reservoir.data.tokens import TokenData, prepare_data

__all__ = ["Corpus", "DataError", "load_corpus", "synthetic_stories", "TOKENIZERS", "tokenizer_hash", "TokenData",
           "prepare_data"]
