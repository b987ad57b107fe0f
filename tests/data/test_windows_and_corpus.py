"""The data package outside ingestion: windows over a token stream, the sampler's state, and the
built-in default corpus."""

import numpy as np

from sheepop.data.corpus import stdlib_files, stdlib_texts
from sheepop.data.windows import WindowSampler, chunk_starts, eval_windows, window


def test_chunks_cover_the_stream_and_pad_the_last_window():
    tokens = np.arange(11)  # 10 (input, target) pairs
    assert chunk_starts(11, 4, 4).tolist() == [0, 4, 8]
    assert chunk_starts(11, 4, 3).tolist() == [0, 3, 6]  # 6 + 4 covers pair 9
    assert chunk_starts(12, 4, 3).tolist() == [0, 3, 6, 9]  # pair 10 needs a padded window
    x, y = window(tokens, 8, 4, pad_id=99)
    assert x.tolist() == [8, 9, 99, 99] and y.tolist() == [9, 10, -1, -1]
    x, y = window(tokens, 0, 4, pad_id=99)
    assert x.tolist() == [0, 1, 2, 3] and y.tolist() == [1, 2, 3, 4]

def test_sampler_state_round_trips_through_json():
    import json
    tokens = np.arange(100)
    for mode in ("random", "chunks"):
        a = WindowSampler(tokens, 8, 3, seed=5, mode=mode, stride=5)
        a.next_batch()
        saved = json.loads(json.dumps(a.state()))
        expected = [a.next_batch() for _ in range(20)]
        b = WindowSampler(tokens, 8, 3, seed=123, mode=mode, stride=5)
        b.set_state(saved)
        for (x1, y1), (x2, y2) in zip(expected, [b.next_batch() for _ in range(20)]):
            assert (x1 == x2).all() and (y1 == y2).all()
            assert (y1[y1 >= 0] == x1[y1 >= 0] + 1).all()  # targets are the next tokens

def test_eval_windows_are_fixed_and_spread():
    x, y = eval_windows(np.arange(1000), 10, 5, pad_id=0)
    assert x[:, 0].tolist() == [0, 250, 500, 740, 990] and (y[-1][-1] == -1)

def test_eval_windows_leave_out_the_columns_every_window_pads():
    """A text shorter than the context is one window of its own length (SmolLM2's context of
    8,192 made a sentence's loss an attention over 8,192 positions); a column some window
    still scores stays, and so does the whole width when one window is full."""
    x, y = eval_windows(np.arange(6), 8192, 10, pad_id=0)
    assert x.tolist() == [[0, 1, 2, 3, 4]] and y.tolist() == [[1, 2, 3, 4, 5]]
    x, y = eval_windows(np.arange(14), 8, 10, pad_id=99)
    assert x.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 99, 99, 99]]
    assert y[1].tolist() == [9, 10, 11, 12, 13, -1, -1, -1]


def test_default_corpus_is_the_stdlib_in_a_fixed_order():
    files = stdlib_files()
    assert files == sorted(files, key=lambda p: p.parts) or files == stdlib_files()
    assert any(f.name == "os.py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    texts, report = stdlib_texts(200_000)
    assert report.files_read == len(texts) and report.truncated
    assert 190_000 <= report.bytes_read <= 200_000
    assert "read" in report.summary() and "MB" in report.summary()
