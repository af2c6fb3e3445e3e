"""Writes corpus.jsonl, the strings pdserve's tokenizers are checked on against the oracle.

Deterministic; run `/usr/bin/python3 tests/tokenizer/gen_corpus.py` after editing and commit the
result. Two characters are left out on purpose: U+0085 (NEXT LINE) and U+FEFF (BOM). JavaScript's
`\\s` (the oracle) disagrees with Hugging Face tokenizers' (Oniguruma) and tiktoken's on both;
pdserve follows the latter, and common/tokenizer's unit tests pin that down.
"""

import json
import os
import random

rng = random.Random(20261130)

base = []

# Whitespace runs, tabs, newlines, CRLF.
base += ["", " ", "  ", "\t", "\n", "\r\n", " \n ", "\n\n\n", "\t\t x", "\r\n\r\n", "x\r\ny", "\n \n",
         "   leading", "trailing   ", "  both  ", " \t mixed \t ", "a\u00a0b", "a\u3000b", "a\u2028b",
         "a\u200bb", "tab\tseparated\tvalues", "line one\nline two\n", "\n\nstarts with newlines"]
for k in range(1, 9):
    base.append("a" + " " * k + "b")
    base.append("a" + "\t" * k + "b")
    base.append("a" + "\n" * k + "b")
    base.append("word" + " " * k)
    base.append(" " * k + "word")
    base.append("x" + "\r\n" * k + "y")
    base.append("end" + " " * k + "\n" * (k % 3 + 1) + "next")

# Numbers of every length and shape.
for n in range(1, 21):
    base.append("".join(str((i * 7 + n) % 10) for i in range(n)))
base += ["3.14159", "-42", "1,000,000", "1e10", "6.022e23", "0x1F", "0b1010", "2026-11-30",
         "12:30:45", "$100.00", "50%", "#1", "No. 7", "1st 2nd 3rd 4th", "v1.2.3", "+33 6 12 34 56 78",
         "٣٤٥", "१२३", "Ⅻ", "½ ¾", "10^9", "3×4=12"]

# Contractions in both cases.
for w in ["I'm", "you're", "it's", "don't", "we've", "he'll", "she'd", "they've", "can't",
          "won't", "isn't", "y'all", "rock'n'roll", "O'Neil's"]:
    base += [w, w.upper(), w.capitalize(), "Well, " + w + " fine", w + "s"]
base += ["'s", "'S start", "it''s", "quote 'single' and \"double\"", "''"]

# Accents, combining marks, scripts.
base += ["café", "naïve", "résumé", "Zürich", "São Paulo", "Ångström", "Ελληνικά γράμματα",
         "cafe\u0301", "n\u0303o", "e\u0301\u0301\u0301", "a\u0308\u0304", "Z\u0351\u036b\u0343\u032a",
         "ḁ̴̢", "Ǆemal", "ﬁne ﬂow", "ﬀ", "Å vs A\u030a", "한국어 텍스트", "ᄀ\u1161", "가",
         "日本語のテキストです。", "中文测试，你好！", "Hello世界", "東京 タワー", "ｶﾀｶﾅ",
         "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Ёжик в тумане", "नमस्ते दुनिया",
         "สวัสดีชาวโลก", "Γειά σου Κόσμε", "Tiếng Việt có dấu", "ქართული", "Հայերեն", "ᚠᚢᚦᚨᚱᚲ",
         "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝕏 𝕐 ℤ", "Ⓐⓑⓒ", "Ⅰ Ⅱ Ⅲ"]

# Emoji: joiners, skin tones, flags, keycaps, variation selectors.
base += ["🎉", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇩🇪🇯🇵", "❤️", "❤", "🧑🏿‍🚀", "1️⃣", "#️⃣",
         "emoji in text 😀 here", "😀😃😄😁", "👩🏻‍💻 coding", "🤷‍♂️", "🫠", "⌚️⏰", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "☃︎ vs ☃️"]

# Code.
base += [
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; }",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": {}}}',
    "<div class=\"x\"><p>Hello &amp; welcome</p></div>",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "if [ -f \"$HOME/.bashrc\" ]; then\n  source ~/.bashrc\nfi",
    "regex = r'^(?P<name>[a-z]+)\\s*=\\s*(\\d+)$'",
    "x=1;y=2;z=x+y",
    "    indented four\n        indented eight\n\tand a tab",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "const f = async (a, b) => { await g(a ?? b); };",
    "a_b_c snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "// comment\n/* block */\n# hash\n-- dash",
    "matrix[i][j] += alpha * (b[k] - c[k]);",
]

# URLs, paths, emails.
base += ["https://example.com/path/to/page?q=1&r=two#frag", "http://127.0.0.1:8080/metrics",
         "user.name+tag@example.org", "ftp://files.example.net/pub/file.tar.gz", "www.x.co.uk",
         "/usr/local/cuda/bin/nvcc", "C:\\Program Files\\App\\app.exe", "git@github.com:org/repo.git",
         "mailto:someone@example.com?subject=Hi", "data:image/png;base64,iVBORw0KGgo="]

# Special-token look-alikes (and the real ones, which must become their ids).
base += ["<s>", "</s>", "<unk>", "<s>hi</s>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
         "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<start_of_turn>user",
         "< s >", "<|im_start", "im_start|>", "<|reserved_special_token_0|>", "[INST] hi [/INST]",
         "<<SYS>>\nsystem\n<</SYS>>", "<pad>", "<mask>", "<0x41>", "<|begin_of_text|><|begin_of_text|>",
         "text<s>glued</s>text", "<|im_end|>\n<|im_start|>assistant\n", "<<s>>", "<</s>", "<|>", "|<>|"]

# Very long words and runs.
base += ["a" * 500, "supercalifragilisticexpialidocious" * 10, "abc" * 300, "😀" * 100, "中" * 200,
         "1234567890" * 50, " " * 400, "\n" * 100, "-" * 300, "=" * 77, "ab" * 250 + " end",
         "Pneumonoultramicroscopicsilicovolcanoconiosis", "Donaudampfschifffahrtsgesellschaftskapitän"]
letters = "abcdefghijklmnopqrstuvwxyz"
base.append("".join(rng.choice(letters) for _ in range(1000)))

# Punctuation and prose.
base += ["“Curly quotes” and ‘single’", "em—dash – en-dash", "ellipsis… and ...", "«guillemets»",
         "¿Qué tal? ¡Hola!", "Hello, world!", "Wait... what?!", "(parens) [brackets] {braces}",
         "a/b\\c|d", "@#$%^&*()_+-=", "~`!", "§¶†‡•", "©®™", "€£¥₹₿", "°C ±5 µm ≤ ≥ ≠ ∞ √ ∑",
         "The quick brown fox jumps over the lazy dog. " * 3,
         "Large language models are served in two phases: prefill and decode. The key-value cache "
         "holds, for every layer and every past token, the keys and values of attention; it is paged "
         "into blocks so that sequences can share a common prefix.",
         "Dr. Smith's patients (aged 18–65) reported a 12.5% improvement; p < 0.05.",
         "E = mc²; H₂O; x⁽ⁿ⁾", "Mixed: English, Français, Deutsch, 日本語, العربية, and emoji 🎉!"]

# Controls (but not U+0085 / U+FEFF: see the docstring).
base += ["\x01\x02", "bell\x07", "del\x7f", "esc\x1b[31mred\x1b[0m", "null\x00byte", "\x0b\x0c"]

# Random mixtures of the pieces above, with every kind of boundary.
pieces = [b for b in base if 0 < len(b) < 60]
for _ in range(160):
    k = rng.randint(2, 5)
    sep = rng.choice(["", " ", "  ", "\n", "\t", "\r\n", " \n"])
    base.append(sep.join(rng.choice(pieces) for _ in range(k)))

# Leading/trailing space variants of short strings.
for b in list(pieces[:60]):
    base += [" " + b, b + " ", b + "\n"]

seen = set()
corpus = []
for s in base:
    assert "\u0085" not in s and "\ufeff" not in s
    if s not in seen:
        seen.add(s)
        corpus.append(s)

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.jsonl")
with open(out, "w", encoding="utf-8") as f:
    for s in corpus:
        f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
print(f"wrote {len(corpus)} strings to {out}")
