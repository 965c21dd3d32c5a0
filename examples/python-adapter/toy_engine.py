"""A toy language model with a prefix cache, in pure Python: the engine the adapter wraps when no real one is given.

It is deterministic and small, but it has what kvproof checks: a state built token by token (a running hash per
position, standing in for a KV cache), next-token scores computed from that state alone, and a prefix cache that
keeps the state of the last request and reuses it when the next prompt strictly extends what was fed. A state
reused wrongly (built from other ids) gives other scores, so a reuse bug shows as a warm reply that differs from a
cold one, as it would in a real engine.

The interface is the one adapter.py drives (a real engine implements the same five methods):

    begin(prompt)      -> reused     decide what the cache keeps for this prompt; raise ContextExceeded if too long
    feed(ids)                        extend the state by ids (a prefill segment, or one generated token)
    scores()           -> [float]    next-token scores from the state
    spoil()                          forget the state after a failure mid-way (a half-written state is never reused)
    reset()                          forget everything
"""

# Bytes 0..255 and eight named ids, laid out as kvproof's own byte vocabulary (whose ids the harness's synthetic
# prompts use): bos, eos, then role markers and the rest.
SPECIALS = ("bos", "eos", "system", "user", "assistant", "tool", "audio", "pad")
VOCAB = 256 + len(SPECIALS)
BOS = 256
EOS = 257
MAX_CTX = 2048
# Added to eos's score: replies end at eos after about 18 tokens on average.
EOS_BIAS = 0.05

_MASK = (1 << 64) - 1


def _mix(h, x):
    """SplitMix64 of h combined with x: a well-spread 64-bit hash."""
    z = (h ^ ((x + 0x9E3779B97F4A7C15) & _MASK)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class ContextExceeded(Exception):
    def __init__(self, used, limit):
        super().__init__(f"{used} > {limit}")
        self.used = used
        self.limit = limit


class ToyEngine:
    """Byte-level tokens (0..255) and eight named ids; a strict-prefix cache of one conversation."""

    vocab = VOCAB
    eos = EOS
    max_ctx = MAX_CTX
    reuse_rule = "strict"

    def __init__(self, seed=0):
        self.seed = seed
        self.ids = []  # what the state was built from
        self.states = []  # the running hash after each id

    # ---- text ----------------------------------------------------------------------------------------------------

    def tokenize(self, text: bytes):
        return list(text)

    def token_bytes(self, tid):
        if tid < 256:
            return bytes([tid])
        return b"<|" + SPECIALS[tid - 256].encode() + b"|>"

    def render_chat(self, messages):
        """The chat template: bos, then `role: content` lines, then `assistant: ` where the reply begins.
        Prefix-stable: turn N+1 begins with everything turn N fed when the reply renders back to its own bytes."""
        text = b""
        for m in messages:
            text += m["role"].encode() + b": " + m["content"].encode() + b"\n"
        return [BOS] + self.tokenize(text + b"assistant: ")

    # ---- state ---------------------------------------------------------------------------------------------------

    def begin(self, prompt):
        """Keep the cached state when `prompt` strictly extends what it was built from; else start over.
        Checked before anything is touched, so a too-long prompt leaves the cache as it was."""
        if len(prompt) > self.max_ctx:
            raise ContextExceeded(len(prompt), self.max_ctx)
        held = len(self.ids)
        if held and len(prompt) > held and prompt[:held] == self.ids:
            return held
        self.ids, self.states = [], []
        return 0

    def feed(self, ids):
        h = self.states[-1] if self.states else _mix(self.seed, 0x5EED)
        for t in ids:
            h = _mix(h, t)
            self.ids.append(t)
            self.states.append(h)

    def scores(self):
        h = self.states[-1]
        s = [(_mix(h, t) >> 11) / float(1 << 53) for t in range(self.vocab)]
        s[BOS] = -1.0  # never generated
        s[EOS] += EOS_BIAS
        return s

    def spoil(self):
        self.ids, self.states = [], []

    def reset(self):
        self.ids, self.states = [], []
