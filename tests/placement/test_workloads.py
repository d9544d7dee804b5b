"""The MetaSyn-like generator (facts, calibration, streams), tasks, and file loaders."""

import json

import numpy as np
import pytest

from tfra_dynamic_embedding.placement import loaders, streams, workloads


@pytest.fixture(scope="module")
def pool():
    return workloads.generate_pool(856, seed=0)


def test_pool_matches_published_facts(pool):
    stats = workloads.pool_statistics(pool)
    assert stats["num_tables"] == 856
    assert (stats["rows_max"], stats["rows_min"]) == (12_543_670, 1)
    assert stats["rows_mean"] == pytest.approx(4_107_458, abs=1.0)
    assert (stats["pooling_max"], stats["pooling_min"]) == (193.0, 0.0)
    assert stats["pooling_mean"] == pytest.approx(15.0, abs=1e-3)
    pooling = np.array([t.pooling_factor for t in pool])
    assert 0.85 <= np.mean(pooling < 50) <= 0.97         # power law: most below 50 ...
    assert np.sum(pooling > 150) >= 3                     # ... some near 200
    assert abs(stats["rank_correlation_rows_pooling"]) < 0.1
    assert {t.dim for t in pool} == set(workloads.DEFAULT_DIMS)
    assert len({t.name for t in pool}) == 856 and pool[0].name == "t000"


def test_generator_is_seeded():
    a = workloads.generate_pool(40, seed=3)
    b = workloads.generate_pool(40, seed=3)
    c = workloads.generate_pool(40, seed=4)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert [t.rows for t in a] != [t.rows for t in c]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pooled_reuse_histogram_matches_published_2021(seed, pool):
    tables = pool if seed == 0 else workloads.generate_pool(856, seed=seed)
    report = workloads.calibration_report(tables)
    tol = workloads.CALIBRATION_TOLERANCE
    assert report["lookups"]["max_abs"] <= tol["max_abs"], report["lookups"]
    assert report["lookups"]["l1"] <= tol["l1"], report["lookups"]
    assert report["unique"]["max_abs"] <= tol["unique_max_abs"], report["unique"]
    assert report["within_tolerance"]
    # The spec's histograms pool to the same figure.
    lookups = [t.pooling_factor * 65536 for t in tables]
    pooled = streams.pooled_reuse_histogram([t.reuse_histogram for t in tables], lookups)
    assert np.abs(pooled - report["lookups"]["pooled"]).max() < 1e-3


def test_sampled_batches_match_the_expected_histograms(pool):
    chosen = [t for t in pool if 5 <= t.pooling_factor <= 20 and t.rows > 10_000][:3]
    chosen += [t for t in pool if t.rows < 1000 and t.pooling_factor > 1][:1]
    assert len(chosen) == 4
    for spec in chosen:
        indices, offsets = streams.open_stream(spec).batch(0)
        assert offsets.shape == (65537,) and offsets[-1] == indices.size
        assert indices.min() >= 0 and indices.max() < spec.rows
        assert indices.size / 65536 == pytest.approx(spec.pooling_factor, rel=0.03)
        measured = streams.reuse_histogram(indices)
        # A table of < 1000 rows has few rows per bin: one row crossing a bin edge moves ~1%.
        tol = 0.02 if spec.rows > 10_000 else 0.05
        assert np.abs(measured - np.array(spec.reuse_histogram)).max() < tol, spec.name


def test_streams_are_deterministic_with_stable_hot_rows(pool):
    spec = max(pool[:100], key=lambda t: t.pooling_factor)
    stream = streams.open_stream(spec, batch_size=8192)
    a0, o0 = stream.batch(0)
    b0, p0 = streams.open_stream(spec, batch_size=8192).batch(0)
    a1, _ = stream.batch(1)
    np.testing.assert_array_equal(a0, b0)
    np.testing.assert_array_equal(o0, p0)
    assert not np.array_equal(a0[:100], a1[:100])
    def top(x):
        values, counts = np.unique(x, return_counts=True)
        return values[counts.argmax()]

    assert top(a0) == top(a1)                 # the same hottest row in both batches
    indices, offsets, lengths = streams.pool_batch(pool[:3], 0, batch_size=512)
    assert lengths.shape == (3, 512) and offsets[-1] == indices.size
    parts = streams.split_dlrm_arrays(indices, offsets, lengths)
    np.testing.assert_array_equal(parts[0][0], streams.open_stream(pool[0], 512).batch(0)[0])


def test_downscaled_cpu_variant():
    small = workloads.generate_pool(856, seed=0, batch_size=4096, row_scale=1 / 16)
    assert max(t.rows for t in small) == 783_979              # round(12,543,670 / 16)
    assert min(t.rows for t in small) == 1
    report = workloads.calibration_report(small, batch_size=4096)
    hist = np.array(report["lookups"]["pooled"])
    assert hist.sum() == pytest.approx(1.0, abs=1e-3)
    assert hist[:5].sum() > 0.3                    # warm sets keep their low reuse counts
    assert hist[13:].sum() < 0.03                  # 16x fewer lookups: no 8192+ reuse


def test_generator_errors():
    with pytest.raises(ValueError, match="num_tables must be a positive int; got 0"):
        workloads.generate_pool(0)
    with pytest.raises(ValueError, match=r"dims must be a non-empty list of positive ints"):
        workloads.generate_pool(4, dims=[])
    with pytest.raises(ValueError, match=r"row_scale must be in \(0, 1\]; got 2"):
        workloads.generate_pool(4, row_scale=2)


def test_split_and_tasks(pool):
    train, test = workloads.split_pool(pool, seed=0)
    assert len(train) == len(test) == 428
    assert not {t.name for t in train} & {t.name for t in test}
    assert sorted(t.name for t in train + test) == sorted(t.name for t in pool)
    tasks = workloads.make_tasks(test, 3, tables_per_task=80, num_devices=8, memory="16GiB",
                                 seed=1)
    assert [len(t.tables) for t in tasks] == [80, 80, 80]
    assert all(len({x.name for x in t.tables}) == 80 for t in tasks)
    assert all(d.memory_bytes == 16 * 2 ** 30 for d in tasks[0].devices)
    assert tasks[0].devices[7].name == "/job:ps/task:7"
    assert {x.name for x in tasks[0].tables} != {x.name for x in tasks[1].tables}
    with pytest.raises(ValueError, match=r"tables_per_task must be in \[1, 428\]"):
        workloads.make_tasks(test, 1, tables_per_task=500)


def test_dlrm_arrays_to_tables():
    # Two tables, batch 3: lengths [[1, 2, 0], [3, 0, 1]].
    indices = np.array([5, 5, 9, 1, 2, 1, 7])
    offsets = np.array([0, 1, 3, 3, 6, 6, 7])
    lengths = np.array([[1, 2, 0], [3, 0, 1]])
    t0, t1 = loaders.tables_from_dlrm_arrays(indices, offsets, lengths, dim=8, source="x.pt")
    assert (t0.name, t0.rows, t0.dim, t0.pooling_factor) == ("t0", 10, 8, 1.0)
    assert t0.reuse_histogram[:2] == pytest.approx([1 / 3, 2 / 3])
    assert (t1.rows, t1.pooling_factor) == (8, pytest.approx(4 / 3))
    assert t1.reuse_histogram[:2] == pytest.approx([0.5, 0.5])
    assert t1.stream == {"kind": "dlrm_pt", "path": "x.pt", "table": 1}
    with pytest.raises(ValueError, match="offsets and lengths disagree"):
        streams.split_dlrm_arrays(indices, offsets, np.array([[1, 2, 0], [2, 1, 1]]))
    with pytest.raises(ValueError, match=r"lengths must be \[num_tables, batch_size\]"):
        streams.split_dlrm_arrays(indices, offsets, np.array([1, 2]))


def test_dlrm_pt_file(tmp_path):
    path = str(tmp_path / "mini.pt")
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        with pytest.raises(ImportError, match=r"needs PyTorch .*pip install torch"):
            loaders.load_dlrm_pt(path)
        return
    torch.save((torch.tensor([5, 5, 9, 1]), torch.tensor([0, 1, 3, 4, 4]),
                torch.tensor([[1, 2], [1, 0]])), path)
    t0, t1 = loaders.load_dlrm_pt(path)
    assert (t0.rows, t1.rows, t0.pooling_factor) == (10, 2, 1.5)
    indices, offsets = streams.open_stream(t0).batch(0)
    assert indices.tolist() == [5, 5, 9] and offsets.tolist() == [0, 1, 3]


def test_table_lists_json_and_csv(tmp_path, pool):
    for name in ("tables.json", "tables.csv"):
        path = str(tmp_path / name)
        loaders.save_tables(pool[:5], path)
        again = loaders.load_tables(path)
        assert [t.name for t in again] == [t.name for t in pool[:5]]
        assert [(t.rows, t.dim, t.pooling_factor) for t in again] == [
            (t.rows, t.dim, t.pooling_factor) for t in pool[:5]]
        assert again[2].reuse_histogram == pytest.approx(pool[2].reuse_histogram)
    # A saved pool regenerates the same index streams (CSV keeps no stream reference).
    reloaded = loaders.load_tables(str(tmp_path / "tables.json"))
    np.testing.assert_array_equal(streams.open_stream(reloaded[3], 256).batch(2)[0],
                                  streams.open_stream(pool[3], 256).batch(2)[0])
    (tmp_path / "hash.csv").write_text("name,hash_size,dim,pooling_factor,group\nu,7,4,2.5,n1\n")
    (t,) = loaders.load_tables(str(tmp_path / "hash.csv"))
    assert (t.rows, t.dim, t.pooling_factor, t.group, t.bytes_per_value) == (7, 4, 2.5, "n1", 4)
    (tmp_path / "bad.csv").write_text("name,rows\nu,7\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: missing column 'dim'"):
        loaders.load_tables(str(tmp_path / "bad.csv"))
    (tmp_path / "list.json").write_text(json.dumps([{"name": "v", "rows": 3, "dim": 2}]))
    assert loaders.load_tables(str(tmp_path / "list.json"))[0].size_bytes == 24


def _criteo_line(label, c1, c2="", rest="00000001"):
    dense = ["1", "", "3"] + ["0"] * 10
    cats = [c1, c2] + [rest] * 24
    return "\t".join([label] + dense + cats) + "\n"


def test_criteo_tsv_statistics(tmp_path):
    path = tmp_path / "day.tsv"
    path.write_text("".join([_criteo_line("0", "a"), _criteo_line("1", "a"),
                             _criteo_line("0", "b"), _criteo_line("0", ""),
                             _criteo_line("1", "a")]))
    tables = loaders.criteo_tsv_stats(str(path), dim=8, batch_size=2)
    c1, c2, c3 = tables[:3]
    assert len(tables) == 26 and c1.name == "C1"
    assert (c1.rows, c1.pooling_factor, c1.dim) == (2, 0.8, 8)
    # batches [a a] [b -] [a]: 2 lookups reuse 2, two lookups reuse 1.
    assert c1.reuse_histogram[:3] == pytest.approx([0.5, 0.5, 0.0])
    assert (c2.rows, c2.pooling_factor, sum(c2.reuse_histogram)) == (1, 0.0, 0.0)
    assert (c3.rows, c3.pooling_factor) == (1, 1.0)
    whole = loaders.criteo_tsv_stats(str(path), batch_size=65536)[0]
    assert whole.reuse_histogram[:3] == pytest.approx([0.25, 0.0, 0.75])
    indices, offsets = streams.open_stream(c1).batch(1)
    assert indices.tolist() == [0xB] and offsets.tolist() == [0, 1, 1]
    (tmp_path / "bad.tsv").write_text(_criteo_line("0", "zz"))
    with pytest.raises(ValueError, match=r"bad.tsv:1: C1 must be a hex string; got 'zz'"):
        loaders.criteo_tsv_stats(str(tmp_path / "bad.tsv"))
    (tmp_path / "short.tsv").write_text("0\t1\t2\n")
    with pytest.raises(ValueError, match=r"short.tsv:1: expected 40 tab-separated fields"):
        loaders.criteo_tsv_stats(str(tmp_path / "short.tsv"))
