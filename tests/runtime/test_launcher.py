"""Launcher detection from real launcher environments (the variables torchrun, srun and mpirun set)."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import DoctorError
from ddpdoctor.runtime.launcher import detect, expand_nodelist, parse_tasks_per_node


@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu5", ["gpu5"]),
    ("a[1-2],b[09-10],c", ["a1", "a2", "b09", "b10", "c"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
])
def test_slurm_compact_nodelists_expand_like_scontrol(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[01-", "node]", "node[3-1]", "node[a-b]"])
def test_malformed_nodelist_is_a_clear_error(bad: str) -> None:
    with pytest.raises(DoctorError, match="nodelist"):
        expand_nodelist(bad)


def test_tasks_per_node_with_repeats() -> None:
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("8") == [8]


def test_torchrun_environment() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "head",
           "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "0"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (
        "torchrun", 5, 8, 1, 4)
    assert (info.master_addr, info.master_port, info.agent_store) == ("head", 29400, True)


def test_slurm_srun_environment_takes_master_from_the_first_node() -> None:
    env = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]",
           "SLURM_TASKS_PER_NODE": "8(x2)"}
    info = detect(env)
    assert (info.launcher, info.rank, info.world_size, info.local_rank, info.local_world_size) == (
        "slurm", 9, 16, 1, 8)
    assert info.master_addr == "gpu07"
    assert info.nodes == ("gpu07", "gpu08")
    assert info.master_port == 29500 + 4242 % 2500
    assert not info.agent_store


def test_bare_sbatch_script_is_not_mistaken_for_a_rank() -> None:
    # In the batch step SLURM_NTASKS says 16 but only one process runs: waiting for 15 more would hang.
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert detect(env).launcher == "none"


def test_open_mpi_and_pmi_need_master_addr() -> None:
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(DoctorError, match="MASTER_ADDR"):
        detect(ompi)
    info = detect({**ompi, "MASTER_ADDR": "n1"})
    assert (info.launcher, info.rank, info.world_size, info.local_rank) == ("mpi", 3, 4, 1)
    pmi = detect({"PMI_RANK": "2", "PMI_SIZE": "8", "MASTER_ADDR": "n1", "MPI_LOCALRANKID": "0"})
    assert (pmi.rank, pmi.world_size, pmi.local_rank) == (2, 8, 0)


def test_no_launcher_means_self_launch() -> None:
    assert not detect({}).is_launched


@pytest.mark.parametrize("env", [
    {"RANK": "x", "WORLD_SIZE": "2"},
    {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "99999"},
    {"RANK": "5", "WORLD_SIZE": "2"},
    {"RANK": "0", "WORLD_SIZE": "0"},
    {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"},
])
def test_bad_launcher_values_are_one_line_errors(env: dict[str, str]) -> None:
    with pytest.raises(DoctorError):
        detect(env)
