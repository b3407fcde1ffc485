"""One study point per device: what each point's process is given on hosts this machine is not (the assignment is
a pure function of what is visible), and the study's WORKERS against them."""

import pytest

from reservoir.platform.device import POINT_DEVICE_VARIABLE, DeviceError, folded_points, point_slots, study_slots


def test_an_eight_gpu_host_gives_each_point_its_own_gpu():
    slots = point_slots("cuda", [str(k) for k in range(8)], 1, 16)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == [str(k) for k in range(8)]
    assert [s.label for s in slots] == [f"cuda:{k}" for k in range(8)]
    assert {s.env["OMP_NUM_THREADS"] for s in slots} == {"2"}  # 16 cores shared out
    assert all(s.env[POINT_DEVICE_VARIABLE] == s.label for s in slots)
    pairs = point_slots("cuda", [str(k) for k in range(8)], 2, 16)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in pairs] == ["0,1", "2,3", "4,5", "6,7"]
    narrowed = point_slots("cuda", ["2", "5"], 1, 16)  # CUDA_VISIBLE_DEVICES=2,5 on the study
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in narrowed] == ["2", "5"]
    # the device a fold probe (POINTS_PER_DEVICE=probe) times, as the study's process names it
    assert {s.torch_device for s in slots} == {"cuda"} and point_slots("cpu", ["0"], 1, 1)[0].torch_device == "cpu"
    assert {s.torch_device for s in (*point_slots("tpu", ["0", "1"], 1, 8), *point_slots("tpu", [], 1, 2))} == {"xla"}


def test_points_per_device_shares_each_gpu_among_that_many_point_processes_and_the_hosts_cores():
    """POINTS_PER_DEVICE=4 on two GPUs: eight points at once, four confined to each GPU (a small point's kernels
    leave a GPU mostly idle), the 16 cores shared among all eight."""
    slots = point_slots("cuda", ["0", "1"], 1, 16, sharing=4)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0"] * 4 + ["1"] * 4
    assert [s.label for s in slots] == ["cuda:0 (shared by 4 points)"] * 4 + ["cuda:1 (shared by 4 points)"] * 4
    assert all(s.env[POINT_DEVICE_VARIABLE] == s.label for s in slots)  # each point's record says it shared
    assert {s.env["OMP_NUM_THREADS"] for s in slots} == {"2"}
    pairs = point_slots("cuda", [str(k) for k in range(4)], 2, 8, sharing=3)  # a point on two GPUs, three a pair
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in pairs] == ["0,1"] * 3 + ["2,3"] * 3
    assert {s.env["OMP_NUM_THREADS"] for s in pairs} == {"1"}


@pytest.mark.parametrize("kind, devices", [("cpu", ["0", "1"]), ("tpu", []), ("tpu", [str(k) for k in range(8)])])
def test_points_per_device_off_a_gpu_folds_them_in_one_process_a_core_or_chip(kind, devices):
    """Off a GPU the K points of a device are one process that folds them (folded_points): the slots stay one a
    core (the CPU, XLA:CPU) or chip; a GPU shares itself among K processes instead."""
    assert point_slots(kind, devices, 1, 2, sharing=2) == point_slots(kind, devices, 1, 2)
    assert folded_points(kind, 4) == 4 and folded_points("cuda", 4) == 1
    # auto: what each device measured (a TPU chip folds, a core and a GPU keep a point); probe: the study decides
    assert folded_points(kind, "auto") == {"cpu": 1, "tpu": 8}[kind] and folded_points("cuda", "auto") == 1
    assert folded_points(kind, "probe") == "probe" and folded_points("cuda", "probe") == "probe"  # on the GPU itself
    with pytest.raises(DeviceError, match="POINTS_PER_DEVICE must be at least 1, got 0"):
        point_slots("cuda", ["0"], 1, 2, sharing=0)


def test_an_eight_chip_tpu_host_gives_each_point_its_chips_bounds_and_port():
    slots = point_slots("tpu", [str(k) for k in range(8)], 1, 96)
    assert [s.env["TPU_VISIBLE_CHIPS"] for s in slots] == [str(k) for k in range(8)]
    assert {s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"] for s in slots} == {"1,1,1"}
    assert {s.env["TPU_PROCESS_BOUNDS"] for s in slots} == {"1,1,1"}
    ports = [s.env["TPU_PROCESS_PORT"] for s in slots]
    assert len(set(ports)) == 8 and ports[0] == "8476"
    assert all(s.env["TPU_PROCESS_ADDRESSES"] == f"localhost:{s.env['TPU_PROCESS_PORT']}" for s in slots)
    quads = point_slots("tpu", [str(k) for k in range(8)], 4, 96)
    assert [(s.env["TPU_VISIBLE_CHIPS"], s.env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) for s in quads] == [
        ("0,1,2,3", "2,2,1"), ("4,5,6,7", "2,2,1")]


def test_the_cpu_and_xla_cpu_give_a_core_to_each_point(capsys):
    assert [s.env["OMP_NUM_THREADS"] for s in point_slots("cpu", ["0", "1"], 1, 2)] == ["1", "1"]
    xla = point_slots("tpu", [], 1, 2)  # PJRT_DEVICE=CPU: no chips
    assert [s.label for s in xla] == ["xla:cpu", "xla:cpu"]
    assert capsys.readouterr().err == ""


def test_more_threads_per_point_than_cores_is_refused_in_one_line():
    """DEVICES_PER_POINT=100 on 2 cores gave its one point 100 threads, silently; then warned, and ran 25x slower."""
    with pytest.raises(DeviceError, match="DEVICES_PER_POINT=100 would give a point 100 threads on the 2 cores") as e:
        point_slots("cpu", ["0", "1"], 100, 2)
    assert "DEVICES_PER_POINT=2 at most" in str(e.value)
    assert [s.env["OMP_NUM_THREADS"] for s in point_slots("cpu", ["0", "1"], 2, 2)] == ["2"]


@pytest.mark.parametrize("kind, devices, per_point, message", [
    ("cuda", ["0", "1"], 4, "DEVICES_PER_POINT=4 but this host shows 2 GPU(s) (0, 1)"),
    ("tpu", [str(k) for k in range(8)], 3, "a TPU point takes a block of 1, 2, 4 or 8 chips"),
    ("cuda", ["0"], 0, "DEVICES_PER_POINT must be at least 1"),
])
def test_more_devices_per_point_than_visible_is_one_line(kind, devices, per_point, message):
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        point_slots(kind, devices, per_point, 8)


def test_workers_auto_on_this_cpu_and_an_accelerator_that_is_not_here():
    from reservoir.platform.machine import usable_cores

    config = {"DEVICE": "cpu", "USE_TPU": False}
    assert len(study_slots(config, "auto")) == usable_cores()
    assert len(study_slots(config, 5)) == 5  # a number on the CPU is taken as given
    with pytest.raises(DeviceError, match="DEVICE='cuda' is not available"):
        study_slots({"DEVICE": "cuda", "USE_TPU": False}, "auto")


def test_tpu_chips_are_counted_by_device_id_not_by_googles_vendor_id_alone(tmp_path):
    """A GCE VM's virtual NIC (gVNIC) carries Google's PCI vendor id too: counted as a chip, a GPU VM would
    offer TPU points and 'auto' would look for XLA. The PCI bus is the system edge, laid out here as sysfs does."""
    from reservoir.platform.device import tpu_chip_count

    def pci(address: str, vendor: str, device: str | None):
        folder = tmp_path / address
        folder.mkdir()
        (folder / "vendor").write_text(vendor + "\n")
        if device is not None:
            (folder / "device").write_text(device + "\n")

    pci("0000:00:04.0", "0x1ae0", "0x0042")  # gVNIC
    pci("0000:00:05.0", "0x1af4", "0x1000")  # virtio
    pci("0000:00:06.0", "0x1ae0", None)  # a device whose id cannot be read
    assert tpu_chip_count(str(tmp_path)) == 0
    for k, device in enumerate(("0x0063", "0x0063", "0x006f")):  # v5e, v5e, v6e
        pci(f"0000:00:1{k}.0", "0x1ae0", device)
    assert tpu_chip_count(str(tmp_path)) == 3
    assert tpu_chip_count(str(tmp_path / "none")) == 0
