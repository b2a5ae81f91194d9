"""The `netcl` command end to end (in-process): outputs, files and exit codes."""
import pytest

from netcl.apps.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    assert main(["train", "--epochs", "1", "--quiet", "--out", str(d / "m.netcl"),
                 "--checkpoint", str(d / "ck.netcl")]) == 0
    return d


def test_devices(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert out.count("*") >= 1 and "NETCL_DEVICE" in out
    assert main(["devices", "--check"]) == 0  # the selected device builds kernels (the suite's premise)
    out = capsys.readouterr().out
    selected = next(line for line in out.splitlines() if line.startswith("*"))
    assert "[builds kernels]" in selected


def test_devices_check_fails_on_a_device_that_cannot_build(monkeypatch, capsys):
    from netcl.runtime import device

    monkeypatch.setattr(device, "_probed", {})
    monkeypatch.setattr(device, "_PROBE", "__kernel void netcl_probe(__global float *a) { a[0] = no_such; }")
    assert main(["devices", "--check"]) == 3
    captured = capsys.readouterr()
    assert "CANNOT BUILD" in captured.out and "cannot build kernels" in captured.err


def test_train_resume_export_verify(trained, capsys):
    d = trained
    assert main(["train", "--epochs", "2", "--quiet", "--resume", str(d / "ck.netcl"), "--out", str(d / "m2.netcl")]) == 0
    assert "resuming from" in capsys.readouterr().out
    assert main(["export", str(d / "m2.netcl"), str(d / "m.onnx"), "--input-shape", "1,1,8,8", "--dynamic-batch"]) == 0
    assert (d / "m.onnx").stat().st_size > 0
    pytest.importorskip("onnxruntime")
    assert main(["verify", str(d / "m2.netcl"), "--input-shape", "4,1,8,8"]) == 0
    out = capsys.readouterr().out
    assert "max abs diff" in out and "OK" in out


def test_verify_mismatch_exits_1(trained, capsys):
    pytest.importorskip("onnxruntime")
    assert main(["verify", str(trained / "m.netcl"), "--input-shape", "2,1,8,8", "--atol", "0", "--rtol", "0"]) in (0, 1)
    # a negative tolerance can never hold: the mismatch path must exit 1
    assert main(["verify", str(trained / "m.netcl"), "--input-shape", "2,1,8,8", "--atol", "-1", "--rtol", "0"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["export", "missing.netcl", "x.onnx", "--input-shape", "1,1,8,8"], "no such model file"),
    (["verify", "{d}/m.netcl", "--input-shape", "2,3,8,8"], "does not fit"),
    (["export", "{d}/m.netcl", "{d}", "--input-shape", "1,1,8,8"], "directory"),
    (["train", "--resume", "{d}/m.netcl", "--epochs", "3", "--quiet"], "without optimizer state"),
    (["train", "--resume", "{d}/ck.netcl", "--epochs", "1", "--quiet"], "already at epoch 1"),
])
def test_errors_exit_2_with_a_message(trained, capsys, argv, message):
    argv = [a.format(d=trained) for a in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_file_exits_2(tmp_path, capsys):
    (tmp_path / "bad.netcl").write_bytes(b"garbage")
    assert main(["export", str(tmp_path / "bad.netcl"), str(tmp_path / "x.onnx"), "--input-shape", "1,1,8,8"]) == 2
    assert "not a .netcl file" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("argv", [["train", "--epochs", "0"], ["train", "--batch-size", "-3"],
                                  ["export", "a", "b", "--input-shape", "1,x"]])
def test_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_bench_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0 and "--batches" in capsys.readouterr().out


def test_bench_table_says_where_predict_ran():
    from netcl.apps.bench import format_table

    row = dict(model="m", batch=1, netcl=0.2, netcl_tensor=0.3, ort_cpu=0.1, launches=3, unfused_layers=0,
               host_us_per_launch=9.0, diff_ort_cpu=1e-7)
    table = format_table([dict(row, predict_serial=True), dict(row, batch=32, predict_serial=False)])
    assert "predict() on" in table.splitlines()[0]
    assert table.splitlines()[2].endswith("| serial device |") and table.splitlines()[3].endswith("| threaded device |")
    assert "predict() on" not in format_table([row])  # a GPU or PoCL without its serial device: no column
    assert "| 2.00x |" in table


# -- ONNX interop: import, --target, --metadata, --test-case ------------------------------------
def test_export_with_target_metadata_and_test_case(trained, capsys):
    onnx = pytest.importorskip("onnx")
    d = trained
    argv = ["export", str(d / "m.netcl"), str(d / "t.onnx"), "--input-shape", "2,1,8,8", "--target", "onnxruntime-1.15",
            "--metadata", "labels=0,1,2", "--metadata", "note=a=b", "--doc-string", "digits", "--test-case",
            str(d / "case")]
    assert main(argv) == 0
    assert "opset 18" in capsys.readouterr().out
    m = onnx.load(str(d / "t.onnx"))
    props = {p.key: p.value for p in m.metadata_props}
    assert m.opset_import[0].version == 18 and props["labels"] == "0,1,2" and props["note"] == "a=b"
    assert m.doc_string == "digits"
    assert (d / "case" / "model.onnx").exists() and (d / "case" / "test_data_set_0" / "output_0.pb").exists()


def test_import_round_trip(trained, tmp_path, capsys):
    import numpy as np

    from netcl.io import load

    assert main(["export", str(trained / "m.netcl"), str(tmp_path / "m.onnx"), "--input-shape", "1,1,8,8"]) == 0
    assert main(["import", str(tmp_path / "m.onnx"), str(tmp_path / "back.netcl")]) == 0
    assert "parameters" in capsys.readouterr().out
    a, b = load(trained / "m.netcl").state_dict(), load(tmp_path / "back.netcl").state_dict()
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("argv, message", [
    (["export", "{d}/m.netcl", "{d}/x.onnx", "--input-shape", "1,1,8,8", "--target", "onnxruntime-0.1"],
     "known targets: onnxruntime-1.15"),
    (["export", "{d}/m.netcl", "{d}/x.onnx", "--input-shape", "1,1,8,8", "--target", "tensorrt-8.6", "--opset", "19"],
     "tensorrt-8.6 reads opsets up to 17"),
    (["import", "{d}/missing.onnx", "{d}/x.netcl"], "missing.onnx"),
    (["import", "{d}/m.netcl", "{d}/x.netcl"], "not an ONNX model"),
])
def test_interop_errors_exit_2(trained, capsys, argv, message):
    assert main([a.format(d=trained) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_metadata_flag_exits_2(trained):
    with pytest.raises(SystemExit) as e:
        main(["export", str(trained / "m.netcl"), str(trained / "x.onnx"), "--input-shape", "1,1,8,8",
              "--metadata", "novalue"])
    assert e.value.code == 2


def test_interop_help(capsys):
    for cmd in ("import", "export"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
    out = capsys.readouterr().out
    assert "ONNX" in out and "--target" in out and "onnxruntime-1.15" in out and "--test-case" in out
