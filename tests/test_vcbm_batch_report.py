"""The batched VCBM command's report: a seed whose role refresh found no bookmark is counted in one line, where a
single run of that seed prints its own warning."""

from algorithms import train
from algorithms.tabular.vcbm_batch import main, run_batch

FELL_BACK = "fell_back_to_random"  # the summary key (algorithms.tabular.vcbm_batch.FELL_BACK)


def test_batch_counts_the_seeds_without_bookmarks_in_one_line(capsys):
    assert main(["--seeds", "20"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # not one warning per seed
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("vcbm: 20 seeds") and "roles right in 20" in lines[0]
    count = int(lines[1].split(" of 20 seeds found no bookmark at a role refresh")[0])
    assert count >= 1
    assert count == sum(summary[FELL_BACK] for summary in run_batch(range(20)))


def test_fell_back_marks_the_seeds_whose_single_run_warns(tmp_path, capsys):
    summaries = run_batch(range(20))
    fell, kept = (next(s["seed"] for s in summaries if s[FELL_BACK] is value) for value in (True, False))
    capsys.readouterr()
    for seed, warns in ((fell, True), (kept, False)):
        train.run(["--algo", "vcbm", "--seed", str(seed), "--log-dir", str(tmp_path / str(seed)), "--no-progress"])
        assert ("warning: VCBMAgent found no " in capsys.readouterr().err) is warns
