"""webhook/agent/kernel.py: ``/proc/swaps`` and PSI text as kernels write them, where the
host's files are found, and kernel PSI triggers (never written into a file that is not the
kernel's)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from webhook.agent.kernel import (
    HostPaths,
    KernelReadError,
    Psi,
    PsiTrigger,
    SwapDevice,
    SwapFacts,
    parse_psi,
    parse_swaps,
    read_psi,
    read_swap,
    wait_for_triggers,
)

HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


# -- /proc/swaps


def test_swaps_header_only_is_no_swap() -> None:
    assert parse_swaps(HEADER) == ()
    assert SwapFacts(parse_swaps(HEADER)).kind is None
    assert SwapFacts(parse_swaps(HEADER)).total() == 0


@pytest.mark.parametrize("text", ["", "\n", "/swapfile file 1024 0 -2\n"])
def test_swaps_without_header_is_unreadable(text: str) -> None:
    with pytest.raises(KernelReadError) as caught:
        parse_swaps(text)
    assert caught.value.errno == errno.EINVAL


def test_swaps_file_and_partition_are_disk_in_bytes() -> None:
    text = (HEADER + "/swapfile                               file\t\t2097148\t\t1024\t\t-2\n"
            "/dev/nvme0n1p3                          partition\t8388604\t\t0\t\t-3\n")
    devices = parse_swaps(text)
    assert devices == (SwapDevice("/swapfile", "disk", 2097148 * 1024, 1024 * 1024),
                       SwapDevice("/dev/nvme0n1p3", "disk", 8388604 * 1024, 0))
    facts = SwapFacts(devices)
    assert facts.kind == "disk"
    assert facts.total() == facts.total("disk") == (2097148 + 8388604) * 1024
    assert facts.total("zram") == 0


def test_zram_is_told_by_its_name_whatever_its_type() -> None:
    text = HEADER + "/dev/zram0                              partition\t4194300\t\t0\t\t100\n"
    (device,) = parse_swaps(text)
    assert device == SwapDevice("/dev/zram0", "zram", 4194300 * 1024, 0)
    assert SwapFacts((device,)).kind == "zram"


@pytest.mark.parametrize("path", ["/dev/zram", "/dev/zramX", "/srv/zram0.img", "/dev/zram0p1",
                                  "/zram0/swapfile"])
def test_names_that_only_look_like_zram_are_disk(path: str) -> None:
    (device,) = parse_swaps(HEADER + f"{path} file 1024 0 -2\n")
    assert device.kind == "disk"


def test_mixed_kinds() -> None:
    text = HEADER + "/swapfile file 1024 0 -2\n/dev/zram1 partition 2048 0 100\n"
    facts = SwapFacts(parse_swaps(text), zswap=True)
    assert facts.kind == "mixed"
    assert (facts.total("disk"), facts.total("zram"), facts.total()) == (
        1024 * 1024, 2048 * 1024, 3072 * 1024)


def test_path_with_escaped_space_stays_one_field() -> None:
    # the kernel writes a space in a path as \040 (seq_file escaping)
    text = HEADER + "/mnt/swap\\040files/one\tfile\t1024\t0\t-2\n"
    (device,) = parse_swaps(text)
    assert device.path == "/mnt/swap\\040files/one"
    assert device.kind == "disk"
    assert device.size == 1024 * 1024


def test_blank_lines_are_skipped() -> None:
    assert len(parse_swaps(HEADER + "\n/swapfile file 8 0 -2\n\n")) == 1


@pytest.mark.parametrize("line", [
    "/swapfile file 1024",  # too few fields
    "/swapfile file big 0 -2",  # size not a number
    "/swapfile file 1024 -5 -2",  # used negative
    "/swapfile file 1.5 0 -2",  # size not whole
    "garbage",
])
def test_malformed_line_is_a_kernel_read_error(line: str) -> None:
    with pytest.raises(KernelReadError) as caught:
        parse_swaps(HEADER + "/dev/sda2 partition 100 0 -2\n" + line + "\n")
    assert caught.value.errno == errno.EINVAL
    assert line[:20] in str(caught.value)


def test_read_swap_reads_zswap_and_survives_its_absence(tmp_path: Path) -> None:
    paths = HostPaths(proc=tmp_path / "proc", sys=tmp_path / "sys")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "swaps").write_text(HEADER + "/swapfile file 4 0 -2\n")
    assert read_swap(paths) == SwapFacts((SwapDevice("/swapfile", "disk", 4096, 0),), False)
    parameter = tmp_path / "sys" / "module" / "zswap" / "parameters" / "enabled"
    parameter.parent.mkdir(parents=True)
    parameter.write_text("Y\n")
    assert read_swap(paths).zswap is True
    parameter.write_text("N\n")
    assert read_swap(paths).zswap is False


def test_read_swap_without_the_file_is_a_kernel_read_error(tmp_path: Path) -> None:
    with pytest.raises(KernelReadError) as caught:
        read_swap(HostPaths(proc=tmp_path))
    assert caught.value.errno == errno.ENOENT
    assert "swaps" in str(caught.value)


# -- PSI text


def test_psi_memory_with_full_line() -> None:
    psi = parse_psi("some avg10=12.34 avg60=5.00 avg300=1.00 total=123456789\n"
                    "full avg10=3.21 avg60=1.00 avg300=0.50 total=2345678\n")
    assert psi == Psi(12.34, 123456789, 3.21, 2345678)


def test_psi_cpu_of_old_kernels_has_no_full_line() -> None:
    psi = parse_psi("some avg10=0.00 avg60=0.00 avg300=0.00 total=42\n")
    assert psi == Psi(0.0, 42, None, None)


def test_psi_full_line_without_total_counts_as_absent() -> None:
    psi = parse_psi("some avg10=1.00 avg60=0 avg300=0 total=7\nfull avg10=2.00\n")
    assert (psi.full_avg10, psi.full_total) == (None, None)


@pytest.mark.parametrize("text", [
    "",
    "garbage",
    "full avg10=1.00 avg60=0 avg300=0 total=5\n",  # no some line
    "some avg60=1.00 avg300=0 total=5\n",  # no avg10
    "some avg10=1.00 avg60=1.00 avg300=0\n",  # no total
    "some avg10=x total=y\n",
    "somewhere avg10=1.00 total=5\n",
])
def test_psi_garbage_is_a_kernel_read_error(text: str) -> None:
    with pytest.raises(KernelReadError):
        parse_psi(text)


def test_read_psi_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(KernelReadError) as caught:
        read_psi(tmp_path / "memory")
    assert caught.value.errno == errno.ENOENT


# -- where the host's files are


def _pressure_file(root: Path, name: str, resource: str = "memory") -> Path:
    path = root / name / f"{resource}.pressure"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    return path


def test_kubepods_pressure_prefers_the_systemd_slice(tmp_path: Path) -> None:
    paths = HostPaths(cgroup=tmp_path)
    assert paths.kubepods_pressure("memory") is None
    cgroupfs = _pressure_file(tmp_path, "kubepods")
    assert paths.kubepods_pressure("memory") == cgroupfs
    systemd = _pressure_file(tmp_path, "kubepods.slice")
    assert paths.kubepods_pressure("memory") == systemd
    assert paths.kubepods_pressure("cpu") is None  # per resource


def test_kubepods_pressure_named_is_the_only_one_looked_at(tmp_path: Path) -> None:
    _pressure_file(tmp_path, "kubepods.slice")
    named = HostPaths(cgroup=tmp_path, kubepods="custom.slice/kubepods")
    assert named.kubepods_pressure("memory") is None
    own = _pressure_file(tmp_path, "custom.slice/kubepods")
    assert named.kubepods_pressure("memory") == own


def test_kubepods_pressure_skips_a_directory_in_the_files_place(tmp_path: Path) -> None:
    (tmp_path / "kubepods.slice" / "memory.pressure").mkdir(parents=True)
    cgroupfs = _pressure_file(tmp_path, "kubepods")
    assert HostPaths(cgroup=tmp_path).kubepods_pressure("memory") == cgroupfs


def test_host_paths_pressure_is_under_proc(tmp_path: Path) -> None:
    assert HostPaths(proc=tmp_path).pressure("cpu") == tmp_path / "pressure" / "cpu"


# -- kernel triggers


PSI_TEXT = ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


@pytest.mark.parametrize("content", [PSI_TEXT, "", "x"])
def test_trigger_refuses_a_regular_file_and_never_writes_it(tmp_path: Path,
                                                            content: str) -> None:
    """A host path that is a plain file (a wrong mount, a test's fake host) is not the
    kernel's: the agent must fall back to reading it, never write its trigger spec into it."""
    path = tmp_path / "memory"
    path.write_text(content)
    before = os.stat(path)
    trigger = PsiTrigger(path, 600_000, 1_000_000)
    with pytest.raises(OSError):
        trigger.open()
    assert path.read_text() == content
    assert os.stat(path).st_size == before.st_size
    assert trigger.fd == -1


def test_trigger_of_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        PsiTrigger(tmp_path / "memory", 1, 2).open()


def _kernel_trigger() -> PsiTrigger:
    """A trigger on this machine's own memory PSI, where the kernel allows one (from 6.5
    anyone may, for a window that is a multiple of 2 s)."""
    path = Path("/proc/pressure/memory")
    if not path.exists():
        pytest.skip("no /proc/pressure on this kernel")
    trigger = PsiTrigger(path, 1_000_000, 2_000_000)  # half the window stalled: not here
    try:
        trigger.open()
    except OSError as exc:
        pytest.skip(f"the kernel refuses PSI triggers here: {exc}")
    return trigger


def test_kernel_trigger_opens_and_a_wake_fd_ends_the_wait() -> None:
    trigger = _kernel_trigger()
    read_fd, write_fd = os.pipe()
    try:
        assert trigger.spec == "some 1000000 2000000"
        os.write(write_fd, b"\0")
        started = time.monotonic()
        fired = wait_for_triggers([trigger], 60, read_fd)
        assert time.monotonic() - started < 30  # woken by the pipe, not by the timeout
        assert set(fired) <= {trigger}
    finally:
        trigger.close()
        os.close(read_fd)
        os.close(write_fd)
    assert trigger.fd == -1
    trigger.close()  # twice is harmless


def test_wait_without_triggers_or_wake_times_out_empty() -> None:
    assert wait_for_triggers([], 0.05) == []
