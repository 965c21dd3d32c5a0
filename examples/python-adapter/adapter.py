#!/usr/bin/env python3
"""Put an engine with a Python API under kvproof: this speaks kvproof's stdio protocol (docs/protocol.md) on
stdin/stdout and drives the engine through five calls (see toy_engine.py): begin(prompt) -> reused, feed(ids),
scores(), spoil(), reset().

    python3 examples/python-adapter/adapter.py                      # the toy engine in toy_engine.py
    python3 examples/python-adapter/adapter.py --engine llama-cpp --model SmolLM2-135M-Instruct.Q8_0.gguf
    kvproof conformance -- python3 examples/python-adapter/adapter.py

No third-party package is needed for the toy engine. `--break NAME` (repeatable) makes the adapter wrong on
purpose, so `kvproof conformance` can be seen to catch it; see BREAKS below.

What the adapter implements: READY and CAPS; SUBMIT with ids, text or a chat conversation (chat=1), echo=1,
cancel_at=N, logprobs=K, ignore_eos=1; DATA with tid= and gap=; DONE with the reuse count; STOP, CANCEL and RESET,
acted on between tokens and prefill segments (a reader thread parses frames while the engine works); every error
code of the protocol, consuming every declared payload so a bad frame never desynchronises the stream. It offers
no DUMP (the state checks are then skipped) and no audio.
"""

import argparse
import collections
import json
import math
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import toy_engine  # noqa: E402

READY = b"\x01\x01READY\x01\x01\n"
MAX_HEADER = 64 * 1024
MAX_PAYLOAD = 64 << 20
PREFILL_SEGMENT = 16
OPTIONS = ("ids", "logprobs", "top_k", "seed", "ignore_eos", "chat", "echo", "cancel_at")

BREAKS = {
    "no-reuse-caps": "CAPS without reuse=1 (DONE still carries the count)",
    "refuse-verbs": "every verb but SUBMIT answered BAD_FRAME, though CAPS declares stop, cancel and reset",
    "feed-eos": "a reply's last token is fed back into the state when it is eos",
    "wrong-tok-s": "DONE's tok_s a thousand times too low",
    "done-early": "DONE written before the reply's last DATA",
    "no-tid": "DATA without tid=",
    "no-cache": "the cache cleared before every request (reuse never engages; DONE reports 0)",
    "count-fed-last": "the reuse count includes one id more than the cache held",
    "silent-errors": "bad frames get no answer",
    # not a fault: a reader this slow is within the protocol, and the probe must still see CANCEL work
    "slow-first-cancel": "the first CANCEL of a generating request is read only after its reply ended",
}


# ---------------------------------------------------------------------------------------------------------------------
# The engine. A real one plugs in here: anything with the five calls toy_engine.ToyEngine documents.


class LlamaCppEngine:
    """llama-cpp-python behind the adapter's five calls (pip install llama-cpp-python; a GGUF model). A sketch of
    where a real engine plugs in: kvproof's own tests run the toy engine, not this.

    llama.cpp keeps one sequence's KV cache and, like this class, reuses the longest common prefix of what it
    holds and the new prompt (bounded by the prompt's length - 1, so there is a position to sample from): the
    `lcp` rule."""

    reuse_rule = "lcp"

    def __init__(self, model_path, n_ctx=2048):
        from llama_cpp import Llama  # the only third-party import, and only for this engine

        self.llm = Llama(model_path=model_path, n_ctx=n_ctx, verbose=False)
        self.vocab = self.llm.n_vocab()
        self.eos = self.llm.token_eos()
        self.max_ctx = self.llm.n_ctx()

    def tokenize(self, text):
        return self.llm.tokenize(text, add_bos=False, special=True)

    def token_bytes(self, tid):
        return self.llm.detokenize([tid])

    def render_chat(self, messages):
        # the GGUF's own chat template (tokenizer.chat_template), rendered by llama-cpp-python's formatter
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.llm.metadata["tokenizer.chat_template"]
        eos = self.llm.detokenize([self.eos]).decode("utf-8", "replace")
        bos = self.llm.detokenize([self.llm.token_bos()]).decode("utf-8", "replace")
        fmt = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos, add_generation_prompt=True)
        return self.tokenize(fmt(messages=messages).prompt.encode())

    def begin(self, prompt):
        if len(prompt) > self.max_ctx:
            raise toy_engine.ContextExceeded(len(prompt), self.max_ctx)
        held = self.llm.input_ids[: self.llm.n_tokens].tolist()
        n = 0
        while n < len(held) and n < len(prompt) - 1 and held[n] == prompt[n]:
            n += 1
        self.llm.n_tokens = n  # eval() drops the KV cache past n_tokens before it appends
        return n

    def feed(self, ids):
        self.llm.eval(ids)

    def scores(self):
        return self.llm.scores[self.llm.n_tokens - 1].tolist()

    def spoil(self):
        self.llm.reset()

    def reset(self):
        self.llm.reset()


# ---------------------------------------------------------------------------------------------------------------------
# Frames in: a reader thread parses stdin into the inbox, consuming every declared payload before judging a frame.


class Bad:
    def __init__(self, verb, rid, code, detail):
        self.verb, self.id, self.code, self.detail = verb, rid, code, detail


def count(b):
    """A decimal count: ASCII digits only."""
    return int(b) if b and b.isdigit() and b.isascii() else None


def skip_line(inp):
    while True:
        chunk = inp.readline(MAX_HEADER)
        if not chunk or chunk.endswith(b"\n"):
            return


def read_submit(inp, fields, rid):
    def bad(code, detail):
        return Bad(b"SUBMIT", rid, code, detail)

    n = count(fields[3]) if len(fields) > 3 else None
    if n is None:
        return bad("BAD_FRAME", "SUBMIT without a <bytes> count")
    ext_field = fields[7] if len(fields) > 7 and b"=" not in fields[7] else None
    ext_count = count(ext_field) if ext_field is not None else None
    ext = ext_count or 0
    if n > MAX_PAYLOAD or ext > MAX_PAYLOAD:
        return bad("BAD_FRAME", "declared size above the limit (not consumed)")
    payload = inp.read(n)
    extb = inp.read(ext) if ext else b""
    if len(payload) < n or len(extb) < ext:
        return bad("BAD_FRAME", "input ended inside the payload")
    nl = inp.read(1)
    if nl != b"\n":
        if nl:
            skip_line(inp)
        return bad("BAD_FRAME", "payload not followed by a newline: byte count wrong?")
    if ext_field is not None and ext_count is None:
        return bad("BAD_FRAME", "<ext_bytes> is not a count")
    if len(fields) < 7:
        return bad("BAD_FRAME", "SUBMIT needs <id> <slot> <bytes> <max_tokens> <temp> <top_p>")
    if rid is None:
        return bad("BAD_FRAME", "SUBMIT: id is not a number")
    req = {"id": rid, "payload": payload, "ext": extb, "ids": False, "chat": False, "echo": False, "logprobs": 0,
           "ignore_eos": False, "cancel_at": None}
    req["slot"] = count(fields[2])
    req["max_tokens"] = count(fields[4])
    try:
        temp, top_p = float(fields[5]), float(fields[6])
    except ValueError:
        temp, top_p = float("nan"), float("nan")
    if req["slot"] is None or not req["max_tokens"]:
        return bad("BAD_REQUEST", "slot or max_tokens is not a count >= 1")
    if not (math.isfinite(temp) and temp >= 0) or not (math.isfinite(top_p) and 0 < top_p <= 1):
        return bad("BAD_REQUEST", "temp must be finite >= 0, top_p in (0, 1]")
    seen = set()
    for opt in fields[8 if ext_field is not None else 7:]:
        key, eq, value = opt.partition(b"=")
        key = key.decode("ascii", "replace")
        if not eq or key not in OPTIONS or key in seen:
            return bad("BAD_REQUEST", f"option {opt!r}: unknown, repeated or not k=v")
        seen.add(key)
        if key in ("ids", "chat", "echo", "ignore_eos"):
            if value not in (b"0", b"1"):
                return bad("BAD_REQUEST", f"option {opt!r}: 0 or 1")
            req[key] = value == b"1"
        else:
            v = count(value)
            if v is None:
                return bad("BAD_REQUEST", f"option {opt!r}: not a count")
            req[key] = v
    if req["ids"] and req["chat"]:
        return bad("BAD_REQUEST", "ids=1 and chat=1 both name the payload's form")
    return ("submit", req)


def read_frames(inp, inbox):
    while True:
        line = inp.readline(MAX_HEADER + 1)
        if not line:
            inbox.put(("eof",))
            return
        if not line.endswith(b"\n"):
            if len(line) > MAX_HEADER:
                skip_line(inp)
                inbox.put(Bad(None, None, "BAD_FRAME", "header line longer than 64 KiB"))
            else:
                inbox.put(Bad(None, None, "BAD_FRAME", "input ended inside a header"))
            continue
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
        fields = line.split()
        if not fields:
            inbox.put(Bad(None, None, "BAD_FRAME", "empty line"))
            continue
        verb = fields[0]
        rid = count(fields[1]) if len(fields) > 1 else None
        if verb == b"SUBMIT":
            inbox.put(read_submit(inp, fields, rid))
        elif verb in (b"STOP", b"CANCEL", b"RESET"):
            if len(fields) != 2 or rid is None:
                inbox.put(Bad(verb, rid, "BAD_FRAME", f"{verb.decode()} takes exactly one field <id>"))
            else:
                inbox.put((verb.decode().lower(), rid))
        else:
            inbox.put(Bad(None, None, "BAD_FRAME", f"unknown verb {verb[:40]!r}"))


# ---------------------------------------------------------------------------------------------------------------------
# Frames out, and the serve loop.


class Cancelled(Exception):
    pass


class Server:
    def __init__(self, engine, breaks, out):
        self.engine = engine
        self.breaks = breaks
        self.out = out
        self.inbox = queue.Queue()
        self.jobs = collections.deque()
        self.current = None
        self.eof = False
        self.held_cancel = None  # slow-first-cancel: the CANCEL read only once the reply ended

    def write(self, data):
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:
            os._exit(0)

    def error(self, rid, code, detail=""):
        shown = "-" if rid is None else str(rid)
        self.write(f"ERROR {shown} {code} {detail}".rstrip().encode() + b"\n")

    def caps(self):
        e = self.engine
        caps = [("proto", 1), ("arch", type(e).__name__.lower()), ("preset", "-"), ("slots", 1),
                ("max_ctx", e.max_ctx), ("vocab", e.vocab), ("ids", 1), ("dump", 0), ("reuse", 1), ("stop", 1),
                ("cancel", 1), ("logprobs", 1), ("chat", 1), ("echo", 1), ("reset", 1), ("cancel_at", 1),
                ("audio", 0), ("audio_frame", 0), ("window", "-"), ("prompt_rows", "-"),
                ("initial_capacity", e.max_ctx), ("fault", "none"), ("model", "-"), ("version", 1),
                ("reuse_rule", e.reuse_rule), ("keeps_state_on", "CONTEXT_EXCEEDED")]
        if "no-reuse-caps" in self.breaks:
            caps = [(k, v) for k, v in caps if k != "reuse"]
        return ("CAPS " + " ".join(f"{k}={v}" for k, v in caps) + "\n").encode()

    def in_flight(self, rid):
        return (self.current is not None and self.current["id"] == rid) or any(
            j[0] == "submit" and j[1]["id"] == rid for j in self.jobs)

    def prompt_of(self, req):
        """The prompt ids, or raise (code, detail)."""
        e, rid = self.engine, req["id"]
        if req["slot"] != 0:
            raise ValueError("BAD_REQUEST", f"SUBMIT {rid}: slot {req['slot']} out of range (1 slot)")
        if req["logprobs"] > e.vocab:
            raise ValueError("BAD_REQUEST", f"SUBMIT {rid}: logprobs above the vocabulary")
        if req["ids"]:
            ids = []
            for t in req["payload"].split():
                v = count(t)
                if v is None or v >= e.vocab:
                    raise ValueError("BAD_REQUEST", f"SUBMIT {rid}: {t[:20]!r} is not a token id below {e.vocab}")
                ids.append(v)
        elif req["chat"]:
            try:
                messages = json.loads(req["payload"])
                ok = isinstance(messages, list) and all(
                    isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool")
                    and isinstance(m.get("content"), str) for m in messages)
            except ValueError:
                ok = False
            if not ok:
                raise ValueError("BAD_REQUEST", f"SUBMIT {rid}: chat payload is not a list of messages")
            if not messages:
                raise ValueError("EMPTY_PROMPT", f"SUBMIT {rid}: the conversation has no messages")
            ids = e.render_chat(messages)
        else:
            ids = e.tokenize(req["payload"])
        if req["ext"]:
            raise ValueError("BAD_REQUEST", f"SUBMIT {rid}: this engine takes no audio (ext_bytes must be 0)")
        if not ids:
            raise ValueError("EMPTY_PROMPT", f"SUBMIT {rid}: the prompt has no tokens")
        return ids

    def handle(self, item):
        """Answer or queue one frame (idle, or between tokens of the current request)."""
        if isinstance(item, Bad):
            if "silent-errors" in self.breaks:
                return
            rid = item.id
            if rid is not None and self.in_flight(rid):
                if item.verb == b"SUBMIT":
                    return self.error(rid, "DUPLICATE_ID", "this id is generating or queued")
                rid = None
            return self.error(rid, item.code, item.detail)
        kind = item[0]
        if kind == "eof":
            self.eof = True
        elif kind in ("stop", "cancel", "reset") and "refuse-verbs" in self.breaks:
            self.error(None, "BAD_FRAME", f"unknown verb {kind.upper()}")
        elif kind == "submit":
            req = item[1]
            if self.in_flight(req["id"]):
                return self.error(req["id"], "DUPLICATE_ID", "this id is generating or queued")
            if self.current is not None and self.current["slot"] == req["slot"]:
                return self.error(req["id"], "SLOT_BUSY", f"slot {req['slot']} is generating")
            try:
                req["prompt"] = self.prompt_of(req)
            except ValueError as e:
                return self.error(req["id"], e.args[0], e.args[1])
            req["stop"] = False
            self.jobs.append(("submit", req))
        elif kind == "stop":
            rid = item[1]
            if self.current is not None and self.current["id"] == rid:
                self.current["stop"] = True
            elif any(j[0] == "submit" and j[1]["id"] == rid for j in self.jobs):
                next(j for j in self.jobs if j[0] == "submit" and j[1]["id"] == rid)[1]["stop"] = True
            else:
                self.error(rid, "NOT_FOUND", f"STOP: no request {rid} is generating or queued")
        elif kind == "cancel":
            rid = item[1]
            if self.current is not None and self.current["id"] == rid:
                if "slow-first-cancel" in self.breaks and self.held_cancel is None:
                    self.held_cancel = rid
                    return
                self.current["cancel"] = True
            elif any(j[0] == "submit" and j[1]["id"] == rid for j in self.jobs):
                self.jobs = collections.deque(j for j in self.jobs if not (j[0] == "submit" and j[1]["id"] == rid))
                self.error(rid, "CANCELLED", "cancelled before it started")
            else:
                self.error(rid, "NOT_FOUND", f"CANCEL: no request {rid} is generating or queued")
        elif kind == "reset":
            self.jobs.append(("reset", item[1]))

    def poll(self):
        while True:
            try:
                self.handle(self.inbox.get_nowait())
            except queue.Empty:
                return

    def data(self, rid, tid, scores, logprobs):
        order = sorted(range(len(scores)), key=lambda t: -scores[t])
        gap = scores[order[0]] - scores[order[1]]
        head = f"DATA {rid} {len(self.engine.token_bytes(tid))}"
        if "no-tid" not in self.breaks:
            head += f" tid={tid}"
        head += f" gap={gap!r}"
        if logprobs:
            head += " top=" + ",".join(f"{t}:{scores[t]!r}" for t in order[:logprobs])
        return head.encode() + b"\n" + self.engine.token_bytes(tid) + b"\n"

    def run_submit(self, req):
        e, rid, prompt = self.engine, req["id"], req["prompt"]
        self.current = {"id": rid, "slot": req["slot"], "stop": req["stop"], "cancel": False}
        if req["echo"]:
            body = " ".join(map(str, prompt)).encode()
            self.write(f"PROMPT {rid} {len(body)}\n".encode() + body + b"\n")
        try:
            try:
                reused = e.begin(prompt)
            except toy_engine.ContextExceeded as x:
                return self.error(rid, f"CONTEXT_EXCEEDED {x.used} {x.limit}")
            if "no-cache" in self.breaks and reused:
                e.reset()
                reused = e.begin(prompt)
            polls = 0
            rest = prompt[reused:]
            for at in range(0, len(rest), PREFILL_SEGMENT):
                self.poll()
                if self.current["cancel"] or req["cancel_at"] == polls:
                    raise Cancelled()
                polls += 1
                e.feed(rest[at:at + PREFILL_SEGMENT])
            t1 = time.monotonic()
            tokens, held = [], None
            while True:
                scores = e.scores()
                tid = max(range(len(scores)), key=lambda t: scores[t])
                tokens.append(tid)
                frame = self.data(rid, tid, scores, req["logprobs"])
                if "done-early" in self.breaks:
                    if held:
                        self.write(held)
                    held = frame
                else:
                    self.write(frame)
                self.poll()
                if self.current["cancel"]:
                    raise Cancelled()
                limited = len(tokens) == req["max_tokens"]
                if self.current["stop"] or limited or (tid == e.eos and not req["ignore_eos"]):
                    break
                e.feed([tid])  # every token but the last is fed back
            if "feed-eos" in self.breaks and tokens[-1] == e.eos:
                e.feed([tid])
            decode = time.monotonic() - t1
            stopped = self.current["stop"]
        except Cancelled:
            e.spoil()  # a half-written state is never reused
            return self.error(rid, "CANCELLED")
        finally:
            self.current = None
        tok_s = len(tokens) / decode if decode > 0 else 0.0
        if "wrong-tok-s" in self.breaks:
            tok_s /= 1000.0
        shown_reuse = reused + 1 if "count-fed-last" in self.breaks and reused else reused
        hit = 100.0 * shown_reuse / len(prompt)
        at_eos = tokens[-1] == e.eos and not req["ignore_eos"]
        limited = int(len(tokens) == req["max_tokens"] and not stopped and not at_eos)
        done = (f"DONE {rid} STAT {len(tokens)} {tok_s:.1f} {hit:.1f} {rss_gb():.3f} {len(prompt)} {limited} "
                f"{shown_reuse}\n")
        self.write(done.encode())
        if held:
            self.write(held)
        if self.held_cancel == rid:
            self.error(rid, "NOT_FOUND", f"CANCEL: no request {rid} is generating or queued")

    def serve(self, inp):
        self.write(READY + self.caps())
        threading.Thread(target=read_frames, args=(inp, self.inbox), daemon=True).start()
        while True:
            if self.jobs:
                kind, job = self.jobs.popleft()
                if kind == "submit":
                    self.run_submit(job)
                else:
                    self.engine.reset()
                    self.write(f"CLEARED {job}\n".encode())
                continue
            if self.eof:
                return
            self.handle(self.inbox.get())


def rss_gb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("toy", "llama-cpp"), default="toy")
    ap.add_argument("--model", help="GGUF file (--engine llama-cpp)")
    ap.add_argument("--seed", type=int, default=0, help="the toy engine's seed")
    ap.add_argument("--break", dest="breaks", action="append", default=[], choices=sorted(BREAKS),
                    help="be wrong on purpose: " + "; ".join(f"{k}: {v}" for k, v in BREAKS.items()))
    args = ap.parse_args()
    if args.engine == "llama-cpp":
        if not args.model:
            ap.error("--engine llama-cpp needs --model FILE.gguf")
        engine = LlamaCppEngine(args.model)
    else:
        engine = toy_engine.ToyEngine(args.seed)
    Server(engine, set(args.breaks), sys.stdout.buffer).serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
