"""The sm_90 (H100/H200) code of chosen kernel variants, read from their SASS and PTX without a GPU
(`python -m specpilot.kernels.aot --sass`, the `aot` fixture; that every variant compiles is
`test_aot_variants.py`)."""

import ast

import pytest

pytestmark = pytest.mark.slow  # AOT compilation: minutes on two cores


def plain_launches(stdout: str) -> list[str]:
    """The profile lines of the variants launched without PDL (the PDL twins are checked apart)."""
    return [line for line in stdout.strip().splitlines() if " pdl:" not in line]


def test_sass_profile_counts_the_k_loop(aot):
    """The GEMV's K loop on sm_90: 16-byte weight loads, x pairs through the read-only cache
    (LDG.E.CONSTANT, the inline-PTX gather), one FFMA per weight, and nothing through shared
    memory (the decoded codes meet x where they were loaded; reordering them into column order
    went through STS/LDS and two CTA barriers per code and K step: 5.1 instructions per W12 weight)."""
    run = aot("--quick", "--sass", "gemv n8 k1024 w2 s1 bm1", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    *w12, bf16 = plain_launches(run.stdout)
    assert [line.split(":")[0].split(" w12 even ")[-1] for line in w12] == ["blocks", "blocks wide", "epilogue"]  # every escape mode
    per_weight = [float(line.split(" per weight")[0].split(", ")[-1]) for line in (*w12, bf16)]
    for line in (*w12, bf16):
        mix = ast.literal_eval(line.split("; ")[1])
        assert mix.get("LDG.E.128") and mix.get("LDG.E.CONSTANT") and mix.get("FFMA") == 128, line  # 8 x 1024 / 64 threads
        assert not any(op.startswith(("STS", "LDS", "BAR")) for op in mix), line
    assert all(w > per_weight[-1] > 1.0 for w in per_weight[:-1])  # decoding W12 costs instructions plain weights do not
    assert max(per_weight[:-1]) < 4.5  # ~2.25 to decode, 1 FFMA, the x pairs and addressing
    # Escape entries added into the accumulators (slot <= G) take no shared memory of their own:
    # the kernel has the plain weights' shared-memory ops (the sum over G); the one-hot sum of a
    # wide slot goes through shared memory (76 such ops against 7 with triton 3.6, 80 against 8 with 3.9;
    # a 16-entry slot summed one-hot: 10).
    shared = {line.split(":")[0].split(" even")[-1] or "bf16": int(line.split("shared-memory ops in the kernel ")[1].split(";")[0]) for line in (*w12, bf16)}
    assert shared[" blocks"] == shared["bf16"] < shared[" blocks wide"], shared


def test_w12_gemm_decodes_straight_into_the_mma_fragment(aot):
    """The tensor-core path on sm_90: the planes stream through shared memory with cp.async
    (LDGSTS), the MMA is wgmma (HGMMA), and W12's decoded weights are never stored to shared
    memory (no STS in the K loop): the groups are loaded straight into the A fragment's layout."""
    run = aot("--quick", "--sass", "gemm n64 k256 w4 s3 bm16", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    *w12, bf16 = plain_launches(run.stdout)
    assert [line.split(":")[0].split(" w12 even ")[-1] for line in w12] == ["blocks", "epilogue", "blocks xT"]  # every escape mode
    for line in (*w12, bf16):
        assert "LDGSTS" in line and "HGMMA" in line
    per_weight = [float(line.split(" per weight")[0].split(", ")[-1]) for line in (*w12, bf16)]
    for line, cost in zip(w12, per_weight):
        assert "'STS" not in line and "LDS.64" in line  # 8-byte group loads from the cp.async buffers
        assert cost < 4.0  # ~1.25 to decode, the rest MMA, addressing and copies


def test_sass_profile_finds_the_k_loop_of_tma_loads(aot):
    """With TMA the mbarrier waits' retry paths sit after the kernel's last EXIT and branch back
    into the body; the profile skips those spans (one of them, K loop plus epilogue, read as 874
    instructions per K step at n64 k128 bm32) and counts the loop itself: one K step of n64 k128
    at 16 rows is 8 wgmmas and a TMA load per plane."""
    run = aot("--quick", "--sass", "gemm n64 k128 w4 s3 tma bm16", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 2, run.stdout
    for line in lines:
        mix = ast.literal_eval(line.split("; ")[1])
        assert mix.get("HGMMA.64") == 8 and mix.get("UTMALDG.2D"), line
        assert not any(op.startswith(("ATOMG", "STG")) for op in mix), line  # not the split-K epilogue
    w12, bf16 = (float(line.split(" per weight")[0].split(", ")[-1]) for line in lines)
    assert bf16 < w12 < 4.5


def test_w12_gemm_k_loop_waits_once_per_step(aot):
    """ptxas keeps the K loop's wgmmas asynchronous: far fewer waits (WARPGROUP.DEPBAR) than MMAs.
    Serialized (info C7515, when the accumulator starts from a plain move of zeros; see gemm.py)
    every HGMMA is followed by its own wait."""
    run = aot("--quick", "--sass", "gemm n64 k256 w4 s3 bm16", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    for line in run.stdout.strip().splitlines():
        mix = ast.literal_eval(line.split("; ")[1])
        mmas = sum(n for op, n in mix.items() if op.startswith("HGMMA"))
        waits = sum(n for op, n in mix.items() if op.startswith("WARPGROUP.DEPBAR"))
        assert mmas >= 16 and waits * 8 <= mmas, line


def test_split_k_reset_is_relaxed(aot):
    """The split-K ticket is acq_rel (it orders the partials); the counter's reset is relaxed: an
    acq_rel one puts another fence on the last split's path (0.3-0.45 µs per call at M = 1 on the
    H200)."""
    run = aot("--quick", "--sass", "gemm n64 k256 w4 s3 bm16", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    for line in run.stdout.strip().splitlines():
        atomics = ast.literal_eval(line.split("; atomics ")[1].split("; shared-memory ops")[0])
        assert atomics == ["atom.global.gpu.acq_rel.add.u32", "atom.global.gpu.relaxed.exch.b32"], line


def test_split_attention_streams_the_cache_in_16_byte_loads_into_tensor_cores(aot):
    """The split-KV kernel's key loop on sm_90: K and V tiles in 16-byte loads (a tile of 64 keys x
    64 dims per tensor: 8 per thread of 128), the products on the tensor cores (mma.sync at 16
    query rows, wgmma at 64), with and without the merge."""
    for label, mma in (("attention d64 bm16 bf16", "HMMA"), ("attention d64 bm64 bf16", "HGMMA")):
        run = aot("--quick", "--sass", label, needs="cuobjdump")
        assert run.returncode == 0, run.stderr[-3000:]
        lines = run.stdout.strip().splitlines()
        assert len(lines) == 2, run.stdout  # merged, direct
        for line in lines:
            mix = ast.literal_eval(line.split("; ")[1])
            assert mix.get("LDG.E.128") == 8, line
            assert any(op.startswith(mma) for op in mix), line


def test_gemmas_large_heads_stream_into_tensor_cores_without_spilling(aot):
    """Heads of 256 and 512 (Gemma) on their own tiles (`attention.LARGE_HEAD_TILES`): the split-KV
    kernel's key loop loads K and V in 16-byte loads into tensor cores at every query tile, and
    neither it nor the merge kernel's loop spills registers to local memory (LDL/STL)."""
    run = aot("--quick", "--sass", "attention d256", "attention d512", "merge d256", "merge d512", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = plain_launches(run.stdout)
    assert len(lines) == 12, run.stdout  # D = 256 at 16, 32, 64 query rows, D = 512 at 16: merged, direct, merge
    for line in lines:
        mix = ast.literal_eval(line.split("; ")[1])
        assert mix.get("LDG.E.128") and not any(op.startswith(("LDL", "STL")) for op in mix), line
        if line.startswith("attention"):
            assert any(op.startswith(("HMMA", "HGMMA")) for op in mix), line


def test_kernels_launched_with_pdl_wait_for_the_previous_grid_once_and_release_the_next_once(aot):
    """The variants with PDL on (`kernels.launch.pdl`): one griddepcontrol.wait and one
    launch_dependents (after the main loop) in the PTX of a GEMV, a GEMM, the split-KV kernel and
    its merge; without PDL, neither. The projections load their first weight tile before the wait
    (so it streams while the previous kernel finishes); attention reads nothing before it."""
    def grid(stdout):
        return {line.split(":")[0]: ast.literal_eval(line.rsplit("grid dependency ", 1)[1])
                for line in stdout.strip().splitlines()}

    run = aot("--quick", "--sass", "gemv n8 k1024 w2 s1 bm1", "gemm n64 k256 w4 s3 bm16", "attention d128 bm16 bf16",
              "merge d128 bm16 bf16", needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    runs = grid(run.stdout)
    with_pdl = {label: g for label, g in runs.items() if label.endswith(" pdl")}
    assert {label.split(" bm")[0] for label in with_pdl} == {"gemv n8 k1024 w2 s1", "gemm n64 k256 w4 s3",
                                                             "attention d128", "merge d128"}
    for label, g in with_pdl.items():
        assert (g["wait"], g["launch_dependents"]) == (1, 1), (label, g)
        if label.startswith(("gemv", "gemm")):  # a BF16 row pair or W12 group per load: dozens of them
            assert g["loads_before_wait"] >= 8, (label, g)
        else:
            assert g["loads_before_wait"] == 0, (label, g)
    assert all((g["wait"], g["launch_dependents"]) == (0, 0) for label, g in runs.items() if label not in with_pdl)


def test_moe_expert_kernels_stream_bf16_weights_in_16_byte_loads_with_no_barrier_in_the_loop(aot):
    """The pair-wise MoE projections (`kernels.moe_gemv`) on sm_90: each K step's weights in 16-byte
    loads (gate_up: two [16, 256] tiles, down: one [32, 256], 8 loads per thread of 128) plus one
    of x or h, FMAs, and no layout conversion through shared memory (no barrier) in the loop; with
    PDL, one wait and one release."""
    labels = ("moe_gate_up n16 k256 bf16 even", "moe_down n32 k256 bf16 even")
    run = aot("--quick", "--sass", *labels, needs="cuobjdump")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4, run.stdout  # each without and with PDL
    for line in lines:
        mix = ast.literal_eval(line.split("; ")[1])
        assert mix.get("LDG.E.128") == 9 and mix.get("FFMA") == 64, line
        assert not any(op.startswith(("BAR", "LDS", "STS")) for op in mix), line
        grid = ast.literal_eval(line.rsplit("grid dependency ", 1)[1])
        pdl = line.split(":")[0].endswith(" pdl")
        assert (grid["wait"], grid["launch_dependents"]) == ((1, 1) if pdl else (0, 0)), line
