"""serve.TextStream: text deltas of a growing token list, stop sequences cut as OpenAI cuts them."""
from multidraft.serve import TextStream

CHARS = "abcdefghij \ufffd"


def dec(ids):
    return "".join(CHARS[i] for i in ids)


def ids(text):
    return [CHARS.index(c) for c in text]


def run(chunks, stop=()):
    ts = TextStream(dec, stop)
    out = [ts.push(ids(c)) for c in chunks]
    return ts, out, "".join(out) + ts.finish()


def test_deltas_add_up_to_the_text():
    ts, out, text = run(["ab", "c", "de f"])
    assert out == ["ab", "c", "de f"] and text == "abcde f" and not ts.stopped


def test_stop_sequence_cut_within_one_step_and_across_steps():
    ts, out, text = run(["abc", "def", "gh"], stop=("ef",))
    assert text == "abcd" and ts.stopped and out[-1] == ""
    ts, out, text = run(["abcd", "e", "fgh"], stop=("ef",))
    assert out == ["abcd", "", ""] and text == "abcd" and ts.stopped  # 'e' held back, then cut


def test_held_back_prefix_is_released_when_it_does_not_become_a_stop():
    ts, out, text = run(["abe", "g"], stop=("ef",))
    assert out == ["ab", "eg"] and text == "abeg" and not ts.stopped


def test_earliest_of_several_stops_wins_and_empty_stops_are_ignored():
    _, _, text = run(["abcdefghij"], stop=("", "hi", "cd"))
    assert text == "ab"


def test_incomplete_character_is_held_back():
    ts = TextStream(dec)
    assert ts.push(ids("ab\ufffd")) == "ab"
    assert ts.push(ids("c")) == "\ufffdc"  # the decoder kept it: released with what follows
