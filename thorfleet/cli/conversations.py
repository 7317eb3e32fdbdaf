"""`python -m thorfleet bench INVENTORY --out DIR --conversations N`: conversations through the
door, turn by turn, as a team's chat clients and agents send them: each turn resends the whole
history (a shared system prompt, the first long message, every answer and every new message), so
the prompt grows a few hundred tokens a turn and only what is new needs a prefill where the
conversation's prefix is cached.

    turns = plan(conversations, turns, first, grow)  # pure: who sends what, in order
    messages = history(sent, answers)                         # pure: the turn's whole request
    rows = [ask(...) for each turn]                           # I/O: one streamed answer each
    result = summary(rows)                                    # pure: by turn, by box, hits

Modelled on vLLM's own multi-turn benchmark (benchmarks/multi_turn in vLLM's repository: a client
per conversation, a think time between turns, TTFT by turn), which is not in vLLM's package.
It runs on the laptop, as a client does, with the standard library: the door's URL and CA from the
inventory (as `thorfleet client` hands them out), the key read from its file. Each answer is
streamed; the door says which box answered (X-Thorfleet-Box) and how long the request waited for
a slot (X-Thorfleet-Queued-Ms), and the last chunk carries the usage, cached tokens apart.
"""

from __future__ import annotations

import json
import random
import secrets
import ssl
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass
from http.client import HTTPException, HTTPSConnection

from thorfleet.settings import layout

# Words the prompts are made of: a token or two each for a Mistral tokenizer. The request's own
# usage says how many tokens a prompt was, so this only sets the size roughly.
WORDS = ("river", "stone", "lantern", "orchard", "copper", "meadow", "signal", "harbor", "engine",
         "window", "garden", "ledger", "violet", "summit", "canyon", "thread", "marble", "falcon",
         "beacon", "willow", "compass", "harvest", "pillar", "quartz", "saddle", "tunnel")
TOKENS_PER_WORD = 1.2  # measured on the sim's tokenizer: 2,428 prompt tokens for 2,000 words
SYSTEM = ("You are the team's assistant on the fleet. Answer briefly and precisely; keep to the "
          "facts in the conversation.")


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int  # 1 is the first
    words: int  # the new user message's length


def plan(conversations: int, turns: int, first_tokens: int, grow_tokens: int) -> list[Turn]:
    """Each conversation's turns: the first message `first_tokens` long, each later one
    `grow_tokens` (roughly, in the model's tokens)."""
    return [Turn(c, t, round((first_tokens if t == 1 else grow_tokens) / TOKENS_PER_WORD))
            for c in range(conversations) for t in range(1, turns + 1)]


def text(conversation: int, turn: int, words: int, run: str = "") -> str:
    """A user message: its conversation and turn named first (so no two conversations share
    more than the system prompt), and the bench's `run` (so no run finds another's in a box's
    prefix cache), then words of a generator seeded by conversation and turn."""
    rng = random.Random(conversation * 1000 + turn)
    return f"Conversation {conversation}{f' of run {run}' if run else ''}, message {turn}. " + \
        " ".join(rng.choice(WORDS) for _ in range(words))


def history(sent: list[str], answers: list[str]) -> list[dict]:
    """The turn's whole request: the system prompt, each earlier message and its answer, and
    this turn's message (`sent` holds every user message up to and including this turn's)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for said, answer in zip(sent[:-1], answers, strict=True):
        messages += [{"role": "user", "content": said}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": sent[-1]}]


def summary(rows: list[dict]) -> dict:
    """By turn: median and largest time to first token, the door's wait taken out; the share of
    later turns served by the box that served the turn before (where the prefix is), and of
    prompt tokens served from cache; requests per box. Of the answered turns; the rest (a row
    with an `error`) are counted as failed."""
    answered = [r for r in rows if "error" not in r]
    failed = len(rows) - len(answered)
    rows = answered
    by_turn = {}
    for row in rows:
        by_turn.setdefault(row["turn"], []).append(row)
    turns = {t: {"requests": len(rs),
                 "median_ttft_ms": round(statistics.median(r["ttft_ms"] - r["queued_ms"]
                                                           for r in rs), 1),
                 "max_ttft_ms": round(max(r["ttft_ms"] - r["queued_ms"] for r in rs), 1),
                 "median_queued_ms": statistics.median(r["queued_ms"] for r in rs),
                 "median_prompt_tokens": statistics.median(r["prompt_tokens"] for r in rs),
                 "cached_share": round(sum(r["cached_tokens"] for r in rs)
                                       / max(1, sum(r["prompt_tokens"] for r in rs)), 3)}
             for t, rs in sorted(by_turn.items())}
    previous = {(r["conversation"], r["turn"]): r["box"] for r in rows}
    later = [r for r in rows if r["turn"] > 1 and (r["conversation"], r["turn"] - 1) in previous]
    stayed = [r for r in later if r["box"] == previous[(r["conversation"], r["turn"] - 1)]]
    per_box = {}
    for row in rows:
        per_box[row["box"]] = per_box.get(row["box"], 0) + 1
    mean = len(rows) / max(1, len(per_box))
    first = turns.get(1, {}).get("median_ttft_ms")
    rest = [r["ttft_ms"] - r["queued_ms"] for r in later]
    return {"turns": turns, "requests_per_box": dict(sorted(per_box.items())),
            "busiest_box_vs_mean": round(max(per_box.values(), default=0) / mean, 2) if rows else None,
            "later_turns_on_their_box": round(len(stayed) / len(later), 3) if later else None,
            "later_vs_first_ttft": round(statistics.median(rest) / first, 3)
            if rest and first else None,
            "failed": failed}


class Door:
    """The door as a client reaches it: its URL (with /v1), its CA, a key."""

    def __init__(self, url: str, ca_file: str, key: str):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 443
        self.path = parts.path.rstrip("/")
        self.context = ssl.create_default_context(cafile=ca_file)
        self.key = key

    def ask(self, model: str, messages: list[dict], max_tokens: int,
            headers: dict | None = None) -> dict:
        """One streamed chat completion: when its first token came, its answer, its usage, the
        box that answered and the door's wait, as the door and the last chunk say."""
        body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                           "temperature": 0, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}})
        connection = HTTPSConnection(self.host, self.port, context=self.context,
                                                 timeout=600)
        started = time.monotonic()
        try:
            connection.request("POST", f"{self.path}/chat/completions", body=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self.key}",
                **(headers or {})})
            response = connection.getresponse()
            if response.status != 200:
                return {"error": f"{response.status} {response.read(300).decode(errors='replace')}"}
            first, answer, usage = None, [], {}
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or ():
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        first = first or time.monotonic()
                        answer.append(content)
                usage = event.get("usage") or usage
            details = usage.get("prompt_tokens_details") or {}
            return {"ttft_ms": round(((first or time.monotonic()) - started) * 1000, 1),
                    "answer": "".join(answer), "box": response.getheader(layout.GATEWAY_BOX_HEADER),
                    "queued_ms": float(response.getheader(layout.GATEWAY_QUEUED_HEADER) or 0),
                    "prompt_tokens": usage.get("prompt_tokens", 0),
                    "cached_tokens": details.get("cached_tokens") or 0}
        except (OSError, HTTPException, ValueError) as error:
            return {"error": str(error)}
        finally:
            connection.close()


def converse(door: Door, model: str, turns: list[Turn], answer_tokens: int, think_s: float,
             session: bool = False, progress=None, run: str = "") -> list[dict]:
    """Each conversation in a thread of its own, turn after turn with `think_s` between; every
    turn's row. `session`: send each conversation's own X-Session-Token (else none, as the
    OpenAI SDK sends). `run` names this run in every first message (text())."""
    rows, lock = [], threading.Lock()
    by_conversation = {}
    for turn in turns:
        by_conversation.setdefault(turn.conversation, []).append(turn)

    def one(mine: list[Turn]) -> None:
        sent, answers = [], []
        for turn in mine:
            if turn.turn > 1:
                time.sleep(think_s)
            sent.append(text(turn.conversation, turn.turn, turn.words, run))
            headers = ({"X-Session-Token": f"{run}-conversation-{turn.conversation}"} if session
                       else None)
            got = door.ask(model, history(sent, answers), answer_tokens, headers)
            row = {"conversation": turn.conversation, "turn": turn.turn,
                   **{k: v for k, v in got.items() if k != "answer"}}
            with lock:
                rows.append(row)
                if progress:
                    progress(row)
            if "error" in got:
                return  # the rest of this conversation would not be the same conversation
            answers.append(got["answer"])

    threads = [threading.Thread(target=one, args=(mine,)) for mine in by_conversation.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(rows, key=lambda r: (r["conversation"], r["turn"]))


def plot(rows: list[dict], path) -> bool:
    """DIR/conversations.png: each conversation's time to first token by turn (the door's wait
    taken out), and the box each turn landed on. False without matplotlib (the extra `plot`)."""
    from thorfleet.cli.bench import pyplot, saved

    plt = pyplot()
    if plt is None:
        return False
    figure, (ttft, landed) = plt.subplots(1, 2, figsize=(11, 4))
    boxes = sorted({r["box"] for r in rows if r.get("box")})
    for conversation in sorted({r["conversation"] for r in rows}):
        mine = [r for r in rows if r["conversation"] == conversation and "error" not in r]
        turns = [r["turn"] for r in mine]
        ttft.plot(turns, [(r["ttft_ms"] - r["queued_ms"]) / 1000 for r in mine], marker="o",
                  label=f"conversation {conversation}")
        landed.plot(turns, [boxes.index(r["box"]) if r["box"] in boxes else -1 for r in mine],
                    marker="o", label=f"conversation {conversation}")
    ttft.set(xlabel="turn", ylabel="seconds", title="time to first token (door's wait apart)",
             yscale="log")
    landed.set(xlabel="turn", title="the box that answered", yticks=range(len(boxes)),
               yticklabels=boxes)
    return saved(plt, figure, (ttft, landed), path)


def run(inventory, settings, out, *, conversations: int, turns: int, first_tokens: int,
        grow_tokens: int, answer_tokens: int, think_s: float, model=None, client=None,
        session=False, err=None) -> int:
    """The conversations through the door as the laptop reaches it, progress on stderr;
    DIR/conversations.json ({"summary", "turns": rows}) and DIR/conversations.png written. 0
    when every turn was answered, else 1; 2 for what the operator must fix first."""
    import sys
    from pathlib import Path

    from thorfleet.cli.bench import door_key, the_door
    from thorfleet.settings.roles import thors

    err = err or sys.stderr
    g = the_door(inventory, settings, err)
    if g is None:
        return 2
    served = [pool[0].model for pool in g.pools.values() if pool]
    model = model or served[0]
    if model not in served:
        print(f"thorfleet: --model {model}: no box serves it (the door serves "
              f"{', '.join(served)})", file=err)
        return 2
    try:
        key = door_key(g, settings[thors(inventory)[0].name], client)
        door = Door(g.api_urls[0], g.ca_file, key)
    except (OSError, ValueError) as error:
        print(f"thorfleet: {error}", file=err)
        return 2
    asked = plan(conversations, turns, first_tokens, grow_tokens)
    print(f"thorfleet: bench: {conversations} conversations of {turns} turns to {model} through "
          f"{g.api_urls[0]}", file=err, flush=True)

    def progress(row):
        said = row.get("error") or (f"{row['ttft_ms'] / 1000:.2f} s to the first token on "
                                    f"{row['box']}, {row['cached_tokens']} of "
                                    f"{row['prompt_tokens']} prompt tokens cached")
        print(f"thorfleet: conversation {row['conversation']} turn {row['turn']}: {said}",
              file=err, flush=True)

    run = secrets.token_hex(4)  # this run's conversations are new to every box's cache
    rows = converse(door, model, asked, answer_tokens, think_s, session, progress, run)
    result = {"model": model, "run": run, "conversations": conversations, "turns_each": turns,
              "first_tokens": first_tokens, "grow_tokens": grow_tokens,
              "answer_tokens": answer_tokens, "think_s": think_s, "session_header": session,
              "summary": summary(rows), "turns": rows}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "conversations.json").write_text(json.dumps(result, indent=2) + "\n")
    s = result["summary"]
    for n, t in s["turns"].items():
        print(f"turn {n}: median TTFT {t['median_ttft_ms']:.0f} ms, "
              f"{t['cached_share']:.0%} of prompt tokens cached")
    print(f"later turns on their box: {s['later_turns_on_their_box']}; busiest box "
          f"{s['busiest_box_vs_mean']}x the mean; later / first TTFT {s['later_vs_first_ttft']}")
    drawn = plot(rows, out / "conversations.png")
    print(f"thorfleet: wrote {out / 'conversations.json'}"
          + (f" and {out / 'conversations.png'}" if drawn else ""), file=err)
    expected = conversations * turns
    return 0 if len(rows) == expected and not s["failed"] else 1
