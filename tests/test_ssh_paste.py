"""A paste from an ssh client is bounded: one that never ends, or runs to
megabytes, is cut at PasteLimit's bound with a message, and the session goes on taking keys;
what is shorter reaches the app unchanged, however the client's packets split it."""

from __future__ import annotations

import asyncio
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st
from textual import events
from textual._xterm_parser import XTermParser

from gpuconsole.ssh.paste import END, START, PasteLimit
from tests.fuzz_fixtures import fuzz_settings
from tests.test_ssh_input import typed_session
from tests.waiting import until


def parsed(limit: PasteLimit, reads: list[str]) -> list[events.Event]:
    """What textual's parser makes of `reads` after the limit (no ESCDELAY waits)."""
    parser = XTermParser()
    found: list[events.Event] = []
    for text in reads:
        if kept := limit.feed(text):  # never "": the parser takes it for the end of input
            found.extend(e for e in parser.feed(kept) if isinstance(e, events.Event))
    return found


def pastes(found: list[events.Event]) -> list[str]:
    return [e.text for e in found if isinstance(e, events.Paste)]


def keys(found: list[events.Event]) -> str:
    return "".join(e.character or "" for e in found if isinstance(e, events.Key))


def split(text: str, cuts: list[int]) -> list[str]:
    at = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in pairwise(at)]


def test_a_paste_within_the_bound_passes_unchanged() -> None:
    stream = f"ab{START}hello world{END}cd"
    limit = PasteLimit(max_chars=11)
    assert limit.feed(stream) == stream
    assert limit.cut == 0


def test_a_paste_past_the_bound_is_ended_there_and_its_rest_dropped() -> None:
    limit = PasteLimit(max_chars=5)
    found = parsed(limit, [f"a{START}0123456789", "more and more", f"end{END}b"])
    assert pastes(found) == ["01234"]
    assert keys(found) == "ab"  # nothing of the dropped rest typed as keys
    assert limit.cut == 1


def test_a_paste_that_never_ends_holds_no_more_than_the_bound() -> None:
    limit = PasteLimit(max_chars=1000)
    parser = XTermParser()
    pasted: list[str] = []
    for text in [START] + ["x" * 4096] * 256:  # 1 MiB, no end
        if kept := limit.feed(text):
            pasted += [e.text for e in parser.feed(kept) if isinstance(e, events.Paste)]
    assert pasted == ["x" * 1000]  # handed on once the bound was reached, not at the end
    after = [e for e in parser.feed(limit.feed(f"{END}k")) if isinstance(e, events.Key)]
    assert [e.character for e in after] == ["k"]


@fuzz_settings(500)
@given(
    st.text(alphabet="ab\x1b[012~", max_size=40),
    st.text(alphabet="xyz", max_size=30),
    st.lists(st.integers(0, 120), max_size=12),
    st.integers(1, 40),
)
def test_however_the_reads_split_it_a_paste_comes_out_the_same(
    before: str, body: str, cuts: list[int], bound: int
) -> None:
    stream = f"{before.replace(chr(27), '')}{START}{body}{END}q"
    whole = parsed(PasteLimit(bound), [stream])
    assert pastes(parsed(PasteLimit(bound), split(stream, cuts))) == pastes(whole)
    assert pastes(whole) == [body[:bound]]
    assert keys(parsed(PasteLimit(bound), split(stream, cuts))).endswith("q")


async def test_an_unending_paste_over_ssh_is_cut_with_a_message_and_keys_still_work() -> None:
    async with typed_session([]) as (app, driver):
        driver.feed(START.encode())
        for _ in range(64):  # 4 MiB of paste that never ends, as packets come
            driver.feed(b"y" * 65536)
            await asyncio.sleep(0)
        await until(lambda: len(app.pastes) == 1, timeout=60)
        assert app.pastes == ["y" * 65536]
        [note] = [n.message for n in app._notifications]
        assert note == "Paste cut at 65,536 characters; the rest was dropped."
        driver.feed(f"{END}ok".encode())
        await until(lambda: app.keys[-2:] == ["o", "k"], timeout=60)
        assert app.pastes == ["y" * 65536]  # the dropped rest never arrives
