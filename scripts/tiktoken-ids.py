#!/usr/bin/env python3
"""tiktoken's ids of a text, for checking loco's tokenizer against OpenAI's.

    python3 scripts/tiktoken-ids.py --encoding cl100k_base --ranks cl100k_base.tiktoken TEXT_FILE
    python3 scripts/tiktoken-ids.py --encoding gpt2 --hf-vocab gpt2/tokenizer.json - < TEXT
    python3 scripts/tiktoken-ids.py --encoding o200k_base --ranks o200k_base.tiktoken --pieces TEXT_FILE

Prints the ids on one line (or, with --pieces, the regex pieces as hex, one
a line). Special tokens in the text are encoded as specials
(allowed_special="all"), as loco does.

Engines (--engine, default auto: tiktoken when it imports, else reference):
  tiktoken   OpenAI's package (pip install tiktoken; it must not download:
             the ranks come from --ranks / --hf-vocab, the pattern and
             special tokens from the table below, copied from
             tiktoken_ext/openai_public.py of tiktoken 0.14).
  reference  a plain-Python port of tiktoken's CoreBPE.encode (src/lib.rs):
             the pattern through the `regex` module (Debian: python3-regex),
             a piece that is a token is that token, else byte-pair merging
             of the lowest-ranked adjacent pair, leftmost first. Needs no
             tiktoken; its ids are what tiktoken gives wherever the `regex`
             module and Rust's fancy-regex split alike.
The engine used is printed on stderr.

Rank files: --ranks FILE.tiktoken ("BASE64 RANK" lines, e.g. OpenAI's
cl100k_base.tiktoken, sha256 223921b7...b2a7; o200k_base.tiktoken,
446a9538...1a2d; r50k_base.tiktoken = gpt2's, 306cd27f...d930), or
--hf-vocab tokenizer.json (a byte-level BPE's model.vocab, ids as ranks:
Hugging Face's gpt2 tokenizer.json gives tiktoken's gpt2 ranks).
--write-tiktoken FILE writes the ranks in tiktoken's format and exits.
"""
import argparse
import base64
import hashlib
import json
import sys

# tiktoken_ext/openai_public.py (tiktoken 0.14), verbatim.
R50K_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# meta-llama/llama3 llama/tokenizer.py (the first version), = tiktoken's
# first cl100k pat_str; Hugging Face's Llama 3 tokenizer.json Split regex.
LLAMA3_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# loco's pattern names -> pat_str
PATTERNS = {"gpt2": R50K_PAT, "cl100k": CL100K_PAT, "o200k": O200K_PAT, "llama3": LLAMA3_PAT}

# tiktoken encodings: pattern and special tokens
ENCODINGS = {
    "gpt2": (R50K_PAT, {"<|endoftext|>": 50256}),
    "r50k_base": (R50K_PAT, {"<|endoftext|>": 50256}),
    "cl100k_base": (
        CL100K_PAT,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (O200K_PAT, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
}


def bytes_to_unicode():
    """GPT-2's byte -> printable code point mapping."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(args):
    if args.ranks:
        ranks = {}
        with open(args.ranks, "rb") as f:
            data = f.read()
        print("ranks: %s sha256 %s" % (args.ranks, hashlib.sha256(data).hexdigest()), file=sys.stderr)
        for line in data.splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        return ranks
    dec = {c: b for b, c in bytes_to_unicode().items()}
    with open(args.hf_vocab, encoding="utf-8") as f:
        j = json.load(f)
    added = {a["id"] for a in j.get("added_tokens") or []}
    return {bytes(dec[c] for c in tok): i for tok, i in j["model"]["vocab"].items() if i not in added}


class Reference:
    """tiktoken's CoreBPE.encode (src/lib.rs) in plain Python."""

    def __init__(self, pat, ranks, specials):
        import regex

        self.pat = regex.compile(pat)
        self.ranks = ranks
        self.specials = specials
        self.special_re = regex.compile("|".join(regex.escape(s) for s in specials)) if specials else None

    def bpe(self, piece):
        parts = [piece[i : i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        return [self.ranks[p] for p in parts]

    def encode_ordinary(self, text):
        out = []
        for m in self.pat.finditer(text):
            piece = m.group().encode("utf-8")
            tok = self.ranks.get(piece)
            out.extend([tok] if tok is not None else self.bpe(piece))
        return out

    def encode(self, text):
        out, start = [], 0
        while self.special_re:
            m = self.special_re.search(text, start)
            if not m:
                break
            out += self.encode_ordinary(text[start : m.start()])
            out.append(self.specials[m.group()])
            start = m.end()
        return out + self.encode_ordinary(text[start:])


def make_encoder(engine, name, ranks):
    pat, specials = ENCODINGS[name]
    if engine in ("auto", "tiktoken"):
        try:
            import tiktoken
        except ImportError:
            if engine == "tiktoken":
                raise
        else:
            enc = tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
            print("engine: tiktoken %s" % getattr(tiktoken, "__version__", "?"), file=sys.stderr)
            return lambda text: enc.encode(text, allowed_special="all")
    import regex

    print("engine: reference (regex %s)" % regex.__version__, file=sys.stderr)
    return Reference(pat, ranks, specials).encode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoding", choices=sorted(ENCODINGS), required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ranks", help="a tiktoken rank file")
    src.add_argument("--hf-vocab", help="a byte-level BPE tokenizer.json (ids as ranks)")
    ap.add_argument("--engine", choices=["auto", "tiktoken", "reference"], default="auto")
    ap.add_argument("--pieces", action="store_true", help="print the regex pieces (hex), not ids")
    ap.add_argument("--write-tiktoken", metavar="FILE", help="write the ranks as a tiktoken file")
    ap.add_argument("text", nargs="?", default="-", help="UTF-8 text file (- = stdin)")
    args = ap.parse_args()
    ranks = load_ranks(args)
    if args.write_tiktoken:
        lines = b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(ranks.items(), key=lambda x: x[1]))
        with open(args.write_tiktoken, "wb") as f:
            f.write(lines)
        print("%s: sha256 %s" % (args.write_tiktoken, hashlib.sha256(lines).hexdigest()), file=sys.stderr)
        return
    data = sys.stdin.buffer.read() if args.text == "-" else open(args.text, "rb").read()
    text = data.decode("utf-8")
    if args.pieces:
        import regex

        for m in regex.finditer(ENCODINGS[args.encoding][0], text):
            print(m.group().encode("utf-8").hex())
        return
    print(" ".join(map(str, make_encoder(args.engine, args.encoding, ranks)(text))))


if __name__ == "__main__":
    main()
