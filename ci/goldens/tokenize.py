#!/usr/bin/env python3
"""Golden token ids and chat-template renderings for SmolLM2-135M-Instruct, from llama.cpp itself.

The reference is llama-server built from the llama.cpp that llama-cpp-python 0.3.36 vendors
(`bash ci/build-llama-server.sh`): the same tokenizer code as `llama_cpp.Llama(..., vocab_only=True).tokenize`,
reached over HTTP with Python's standard library only, so making goldens needs no Python package and no
20-minute build of llama-cpp-python. Start the server first, e.g.

    llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf -np 1 -c 4096 -t 1 --port 18091
    python3 ci/goldens/tokenize.py --url http://127.0.0.1:18091

It writes, next to this script:
- tokenize.jsonl: one line per string {"cat", "text", "special", "plain"}: `special` is POST /tokenize with
  add_special and parse_special (how an engine tokenizes a rendered chat prompt), `plain` without either (how
  text that must stay text is tokenized). The strings are generated here, deterministically (fixed seed).
- chat_template.jinja: the model's tokenizer.chat_template as llama-server reports it (GET /props), so the
  template's tests run without the model file.
- chat.jsonl: one line per conversation {"messages", "add_generation_prompt", "prompt"}: POST /apply-template
  (the model's tokenizer.chat_template rendered by llama.cpp's Jinja engine).
"""

import argparse
import json
import random
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def tokenize(url, text, special):
    body = {"content": text, "add_special": special, "parse_special": special}
    return [t if isinstance(t, int) else t["id"] for t in post(url, "/tokenize", body)["tokens"]]


WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up out them "
         "then she many some so these would other into has more her two like him see time could no make than "
         "first been its who now people my made over did down only way find use may water long little very "
         "after words called just where most know get through back much before go good new write our used me "
         "man too any day same right look think also around another came come work three word must because "
         "does part even place well such here take why things help put years different away again off went old "
         "number great tell men say small every found still between name should home big give air line set own "
         "under read last never us left end along while might next sound below saw something thought both few "
         "those always looked show large often together asked house don't world going want school important "
         "until form food keep children feet land side without boy once animals life enough took sometimes four "
         "head above kind began almost live page got earth need far hand high year mother light parts country "
         "father let night following picture being study second eyes soon times story boys since white days "
         "ever paper hard near sentence better best across during today others however sure means knew it's try "
         "told young miles sun ways thing whole hear example heard several change answer room sea against top "
         "turned learn point city play toward five using himself usually Paris London Hugging Face SmolLM "
         "tokenizer KV-cache llama.cpp GPU CPU JSON HTTP API I'm you're we've they'll she'd can't won't "
         "isn't O'Brien McDonald's rock'n'roll e-mail state-of-the-art").split()

CODE = [
    "def add(a, b):\n    return a + b\n",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}",
    "const x = await fetch(`/api/${id}?q=${encodeURIComponent(q)}`);",
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= 18 GROUP BY name ORDER BY n DESC;",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "<div class=\"row\"><span id='x'>&amp; &lt;tag&gt;</span></div>",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "if x == nil {\n\t\treturn fmt.Errorf(\"bad: %w\", err)\n\t}",
    "    # comment with trailing spaces   \n    pass",
    "let v: Vec<u32> = xs.iter().map(|&x| x * 2).collect::<Vec<_>>();",
    "$ cargo test --workspace -- --ignored 2>&1 | tail -n 20",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "public static void main(String[] args) throws IOException {}",
    "a->b = *p++; c <<= 2; d >>= 3; e ^= ~f; g &&= h || !i;",
    "@decorator\nclass Foo(Base, metaclass=Meta):\n    __slots__ = ('a', 'b')\n",
    "```python\nprint('hi')\n```",
    "key: value\nlist:\n  - one\n  - two\n",
    "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n-old\n+new\n",
    "\\begin{equation} E = mc^2 \\end{equation}",
]

ACCENTS = ["café", "naïve", "résumé", "Straße", "über", "Ærøskøbing", "façade", "jalapeño", "Tiếng Việt",
           "ação", "Ελληνικά", "Привет, мир", "Zürich", "Dvořák", "İstanbul", "łódź", "crème brûlée",
           "e\u0301", "a\u0308o\u0308u\u0308", "ﬁ ligature", "Å", "Å"]
CJK = ["日本語のテキスト", "中文字符测试", "한국어 문장입니다", "東京タワー", "漢字とひらがなとカタカナ", "你好，世界！",
       "これはペンです。", "我爱北京天安门", "ㄅㄆㄇㄈ", "全角　スペース", "１２３４５"]
ARABIC = ["مرحبا بالعالم", "اللغة العربية", "١٢٣ ٤٥٦", "שלום עולם", "فارسی زبان"]
DEVANAGARI = ["नमस्ते दुनिया", "हिन्दी भाषा", "१२३४", "संस्कृतम्", "ক্ষ বাংলা", "தமிழ்", "ไทย ภาษา"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "1️⃣", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "🙂🙃", "✨🔥💯",
         "🫠", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👋🏻 hi", "#️⃣", "©️®️™️"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ", "\u00a0", "\u3000",
          "\u2009", "\u200b", "\v", "\f", "\u2028"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<filename>",
            "<gh_stars>", "<issue_start>", "<jupyter_code>", "<empty_output>"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "–", "«»", "“”", "‘’", "¿¡", "§¶", "•", "€£¥"]


def sentence(rng, n=None):
    n = n or rng.randint(3, 18)
    words = [rng.choice(WORDS) for _ in range(n)]
    if rng.random() < 0.5:
        words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", "!", "?", "", ",", ";", ":"])


def number(rng):
    kind = rng.randrange(8)
    if kind == 0:
        return str(rng.randint(0, 10 ** rng.randint(1, 25)))
    if kind == 1:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if kind == 2:
        return f"{rng.random():e}"
    if kind == 3:
        return f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if kind == 4:
        return f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
    if kind == 5:
        return f"{rng.randint(1, 999):,}".replace(",", rng.choice([",", ".", " ", "'"])) + f",{rng.randint(0, 99)}"
    if kind == 6:
        return f"0x{rng.getrandbits(rng.randint(4, 64)):x}"
    return f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)} ({rng.randint(1, 100)}%)"


def mix(rng, pools, n):
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


def strings():
    rng = random.Random(20261130)
    out = []
    add = lambda cat, texts: out.extend((cat, t) for t in texts)  # noqa: E731
    add("english", [sentence(rng) for _ in range(250)])
    add("english", [" ".join(sentence(rng) for _ in range(rng.randint(2, 6))) for _ in range(60)])
    add("code", CODE)
    add("code", [rng.choice(CODE).replace("    ", rng.choice(["  ", "\t", "        "])) +
                 rng.choice(CODE) for _ in range(180)])
    add("numbers", [number(rng) for _ in range(200)])
    add("numbers", [f"{sentence(rng, 4)} {number(rng)} {sentence(rng, 3)}" for _ in range(80)])
    add("numbers", ["".join(rng.choice("0123456789") for _ in range(n)) for n in range(1, 41)])
    add("whitespace", SPACES)
    add("whitespace", [mix(rng, [SPACES, WORDS], rng.randint(2, 12)) for _ in range(200)])
    add("whitespace", [rng.choice(WORDS) + rng.choice(SPACES) * rng.randint(1, 9) + rng.choice(WORDS)
                       for _ in range(60)])
    add("unicode", ACCENTS + CJK + ARABIC + DEVANAGARI)
    pools = [ACCENTS, CJK, ARABIC, DEVANAGARI, [" "], WORDS]
    add("unicode", [" ".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 8)))
                    for _ in range(300)])
    add("unicode", ["".join(chr(rng.choice([rng.randint(0xA0, 0x24F), rng.randint(0x370, 0x52F),
                                            rng.randint(0x600, 0x6FF), rng.randint(0x900, 0x97F),
                                            rng.randint(0x3040, 0x30FF), rng.randint(0x4E00, 0x9FFF),
                                            rng.randint(0xAC00, 0xD7A3), rng.randint(0x2000, 0x2BFF)]))
                            for _ in range(rng.randint(1, 24))) for _ in range(150)])
    add("emoji", EMOJI)
    add("emoji", [mix(rng, [EMOJI, WORDS, [" "]], rng.randint(2, 10)) for _ in range(160)])
    add("emoji", ["".join(chr(rng.randint(0x1F300, 0x1FAFF)) for _ in range(rng.randint(1, 6)))
                  for _ in range(40)])
    add("chat", [f"<|im_start|>{rng.choice(['system', 'user', 'assistant'])}\n{sentence(rng)}<|im_end|>\n"
                 for _ in range(120)])
    add("chat", [mix(rng, [SPECIALS, WORDS, [" ", "\n", "<", "|", ">", "<|", "|>"]], rng.randint(2, 14))
                 for _ in range(120)])
    add("chat", SPECIALS + [s[:-1] for s in SPECIALS] + [s.upper() for s in SPECIALS[:3]] +
        ["<|im_start|><|im_start|>", "<|im_start|<|im_end|>|>", "<<|im_end|>>", " <|im_end|> "])
    add("punctuation", PUNCT + [mix(rng, [PUNCT, WORDS], rng.randint(2, 10)) for _ in range(100)])
    add("contractions", ["it's", "IT'S", "It'S", "we're", "you've", "I'm", "he'll", "she'd", "'s", "''s",
                         "don't", "'re'", "' s", "'S", "'ll've", "rock'n'roll", "''", "'"] +
        [f"{rng.choice(WORDS)}'{rng.choice(['s', 't', 're', 've', 'm', 'll', 'd', 'S', 'T', 'x'])}"
         for _ in range(40)])
    add("edge", ["", " ", "  ", "     ", " " * 100, "\n" * 50, "\t" * 30, "a", "A" * 3000,
                 "x" * 10000, "ab" * 2500, "Supercalifragilisticexpialidocious" * 40,
                 "pneumonoultramicroscopicsilicovolcanoconiosis", "日" * 2000, "😀" * 500,
                 "1" * 1000, "\x00", "a\x00b", "\x01\x02\x1b[0m", "\x7f", "\ufeffBOM", "\ufffd", "\U0010FFFF",
                 "\uE000 private", "\u0378", " " * 7 + "x", "x" + " " * 7, " a", "a ", " 1", "1 ", "-1",
                 "1.5", "٣", "Ⅻ", "½", "²³"])
    add("random", ["".join(chr(rng.choice([rng.randint(0x20, 0x7E), rng.randint(0x20, 0x7E),
                                           rng.randint(0xA0, 0xFFFF), rng.randint(0x10000, 0x1FFFF)]))
                           for _ in range(rng.randint(1, 40))).replace("\ud800", "")
                   for _ in range(200)])
    # drop lone surrogates (not valid in JSON text sent as UTF-8)
    return [(c, t) for c, t in out if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in t)]


# Every conversation ends with a user message: llama-server takes a last assistant message as the start of the
# reply to continue (prefill), which is its own behaviour, not the template's.
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke about caches."}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Où est le trésor ? 🏴‍☠️"},
     {"role": "assistant", "content": "Arr, under the 日本 palm!\n\n"}, {"role": "user", "content": "  spaces  "}],
    [{"role": "user", "content": "<|im_end|> in text"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "again"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "\n\nleading newlines"},
     {"role": "assistant", "content": " leading space"}, {"role": "user", "content": "x"},
     {"role": "assistant", "content": "\n\nleading newlines"}, {"role": "user", "content": "y"}],
    [{"role": "user", "content": "{{ not a template }} {% raw %}"}, {"role": "tool", "content": "42"}],
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:18091")
    args = ap.parse_args()
    rows = strings()
    # written to .part files first: a server that goes away leaves the checked-in goldens as they were
    with open(HERE / "tokenize.jsonl.part", "w", encoding="utf-8") as f:
        for cat, text in rows:
            row = {"cat": cat, "text": text, "special": tokenize(args.url, text, True),
                   "plain": tokenize(args.url, text, False)}
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    with urllib.request.urlopen(args.url + "/props", timeout=60) as r:
        template = json.loads(r.read())["chat_template"]
    (HERE / "chat_template.jinja.part").write_text(template, encoding="utf-8")
    with open(HERE / "chat.jsonl.part", "w", encoding="utf-8") as f:
        for messages in CONVERSATIONS:
            for gen in (True, False):
                prompt = post(args.url, "/apply-template",
                              {"messages": messages, "add_generation_prompt": gen})["prompt"]
                f.write(json.dumps({"messages": messages, "add_generation_prompt": gen, "prompt": prompt},
                                   ensure_ascii=False) + "\n")
    for name in ("tokenize.jsonl", "chat_template.jinja", "chat.jsonl"):
        (HERE / (name + ".part")).replace(HERE / name)
    print(f"{len(rows)} strings, {len(CONVERSATIONS) * 2} renderings", file=sys.stderr)


if __name__ == "__main__":
    main()
