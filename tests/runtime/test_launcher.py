"""Launcher detection from real launcher environments (the variables torchrun, srun and mpirun set)."""

from __future__ import annotations

import pytest

from ddpdoctor.errors import DoctorError
from ddpdoctor.runtime.launcher import detect, expand_nodelist, job_port, parse_tasks_per_node, torchrun_env


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
    assert info.master_port == 29500 + 2 * (4242 % 1250)
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


def test_mpi_on_one_host_uses_the_local_host_and_a_port_from_the_job_id() -> None:
    # What mpirun -np 2 exported on one node here (Open MPI 4.1.4): local size == world size.
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "1934360577", "OMPI_MCA_orte_num_nodes": "1"}
    info = detect(env)
    assert (info.master_addr, info.master_port) == ("127.0.0.1", 29500 + 2 * (1934360577 % 1250))
    assert (info.node_rank, info.num_nodes, info.run_id) == (0, 1, "mpi.1934360577")
    # Open MPI 5 names the job by its PMIx namespace: a string, hashed to the same port on every rank.
    five = detect({**{k: v for k, v in env.items() if "MCA" not in k}, "PMIX_NAMESPACE": "prterun-vm-812@1"})
    assert five.master_port == job_port("prterun-vm-812@1") and 29500 <= five.master_port < 32000
    assert five.master_port % 2 == 0  # odd ports are MASTER_PORT+1 of another job (watch's channel)


def test_mpi_across_hosts_without_master_addr_stays_a_clear_error() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(DoctorError, match="across hosts but MASTER_ADDR is not set"):
        detect(env)
    with pytest.raises(DoctorError, match="MASTER_ADDR"):  # no local size: not known to be one host
        detect({"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_srun_and_mpirun_ranks_get_torchruns_environment() -> None:
    slurm = detect({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                    "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]",
                    "SLURM_STEP_NUM_NODES": "2", "SLURM_TASKS_PER_NODE": "8(x2)"})
    assert torchrun_env(slurm) == {
        "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "9", "ROLE_WORLD_SIZE": "16", "ROLE_NAME": "default",
        "MASTER_ADDR": "gpu07", "MASTER_PORT": str(29500 + 2 * (4242 % 1250))}
    # Open MPI across hosts exports no node index: GROUP_RANK is left out rather than guessed.
    mpi = detect({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                  "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29600"})
    env = torchrun_env(mpi)
    assert (env["RANK"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("3", "1", "n1", "29600")
    assert "GROUP_RANK" not in env
    # Under torchrun (or RANK/WORLD_SIZE set by hand) the variables are there already: nothing is added.
    assert torchrun_env(detect({"RANK": "0", "WORLD_SIZE": "2"})) == {}


def test_one_node_slurm_uses_the_local_host() -> None:
    info = detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7",
                   "SLURM_JOB_NODELIST": "vm", "SLURM_STEP_NUM_NODES": "1"})
    assert (info.master_addr, info.num_nodes, info.node_rank) == ("127.0.0.1", 1, 0)


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
