"""The arithmetic-progression task: a transformer that learns to continue 0042 0049 0056 ...

- `data`      generate progressions, write them as D-digit text, read them back;
- `ood`       how each held-out set beyond the training ranges is drawn;
- `stream`    token streams and term-aligned training windows;
- `task`      the run's task options and training through the shared trainer;
- `evaluate`  batched greedy prediction of held-out continuations, with either engine;
- `scores`    exact-match, per-digit and whole-continuation accuracy, by k and by difference;
- `analysis`  where predictions fail: by the difference's hundreds digit, by carry chain;
- `report`    the terminal table and progression.png.
"""
