"""
Export a checkpoint (GPT layout, any model type) as a Hugging Face GPT2LMHeadModel folder (the machinery:
tpcomm/convert/hf_export.py).

$ python export_hf.py --out_dir=out-shakespeare-char                # writes out-shakespeare-char/hf
"""

import sys

from tpcomm.convert.hf_export import main

if __name__ == "__main__":
    main(sys.argv[1:])
