"""specpilot.bench.kernel_profile on CPU: kernel families and the per-call summary (the profiling
itself needs a GPU)."""

from specpilot.bench.kernel_profile import family, seen, summarize

KERNELS = [("sm90_xmma_gemm_bf16bf16_bf16f32", 6.0), ("nvjet_tst_64x8_64x16", 4.0),
           ("fmha_cutlassF_bf16_aligned_64x64", 9.0), ("void at::native::sbtopk::gatherTopK<float>", 3.0),
           ("triton_poi_fused_add_mul_0", 1.5), ("Memset (Device)", 0.5), ("void at::native::elementwise", 2.0)]


def test_kernel_names_fall_into_their_families():
    assert [family(n) for n, _ in KERNELS] == ["gemm", "gemm", "attention", "topk/sort", "fused triton",
                                                "copy/fill", "other"]
    assert family("rope_store_kernel") == "fused triton"  # not the attention it feeds, nor a copy


def test_the_summary_is_per_call():
    s = summarize(KERNELS * 2, calls=2)
    assert s["kernels_per_call"] == 7 and s["kernel_us_per_call"] == 26.0
    assert s["families"]["gemm"] == {"kernels": 2, "us": 10.0}
    assert list(s["families"])[0] == "gemm"  # largest first
    assert s["top"][0]["name"] == "fmha_cutlassF_bf16_aligned_64x64" and s["top"][0]["us"] == 9.0


def test_a_piece_reads_the_replay_or_else_the_plain_launches():
    some, none = summarize(KERNELS, 1), summarize([], 1)
    assert seen({"graph": some, "plain": none}) is some
    assert seen({"graph": none, "plain": some}) is some
