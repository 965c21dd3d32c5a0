#!/usr/bin/env python3
"""Write the llama.cpp golden file the llama arch's agreement test compares against.

It queries llama-server built from the llama.cpp that llama-cpp-python 0.3.36 vendors (the same sources
`ci/build-llama-server.sh` unpacks and builds): the reference is that llama.cpp, and its server gives token ids,
greedy continuations and top-k log-probabilities over plain HTTP, so this script needs only Python's standard
library and not a 20-minute build of the Python bindings.

For every prompt: its token ids (POST /tokenize, no BOS: SmolLM2 adds none), the greedy continuation of 16
tokens (POST /completion, temperature 0, no prompt cache) and at each step the top-5 ids with their
log-probabilities. Log-probabilities are logits minus a per-step constant (the log of the softmax's sum), so the
test compares differences of them (top-1 minus each top-k), never raw values.

  /work/cache/llama.cpp-0.3.36/build/bin/llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf -np 1 -c 4096 -t 1 \
      --port 18092 &
  python3 ci/goldens/logits.py http://127.0.0.1:18092 > engines/tests/data/smollm2-goldens.json
"""
import json
import sys
import urllib.request

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "The quick brown fox",
    "In 1492, Columbus",
    "Water boils at a temperature of",
    "My favourite colour is",
    "1, 2, 3, 4, 5,",
    "The meaning of life is",
    "To make a cup of tea, first",
    "import numpy as np\n",
    "The largest planet in the solar system is",
    "Dear Sir or Madam,",
    "Photosynthesis is the process by which",
    "Q: What is 2 + 2?\nA:",
    "The best way to learn a language is",
    "Roses are red, violets are",
    "A list of fruits: apple, banana,",
    "Machine learning is",
    "The theory of relativity was developed by",
    "<|im_start|>user\nWhat is the capital of Germany?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a haiku about rain."
    "<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHow many legs does a spider have?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nTranslate 'good morning' into French.<|im_end|>\n<|im_start|>assistant\n",
]


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18092"
    cases = []
    for text in PROMPTS:
        ids = post(base, "/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]
        out = post(base, "/completion", {
            "prompt": ids, "n_predict": 16, "temperature": 0, "n_probs": 5, "cache_prompt": False,
            "post_sampling_probs": False,
        })
        steps = []
        for p in out["completion_probabilities"]:
            steps.append({
                "id": p["id"],
                "top": [[t["id"], round(t["logprob"], 5)] for t in p["top_logprobs"]],
            })
        cases.append({"text": text, "prompt": ids, "steps": steps})
    json.dump({
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "reference": "llama-server from llama-cpp-python 0.3.36's vendored llama.cpp, -t 1, greedy",
        "cases": cases,
    }, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
