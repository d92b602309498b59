

def test_a_saved_choice(dump, run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "advcli.toml").write_text('[compute]\ncolumns = "none"\n')
    _compute(run, dump, tmp_path / "out.parquet")
    assert pl.read_parquet(tmp_path / "out.parquet").columns == NEW
