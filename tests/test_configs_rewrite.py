"""An autotuned kernel's config list, widened (issue 27, Hopper tiling): the searches no longer give up on
a kernel under @triton.autotune; they append to its list, whatever its form (a literal, a helper's
return, a module-level name), keep every config it had, move block sizes only where the grid follows
the picked config, and the widened kernel passes the judge under every config it may pick."""

from __future__ import annotations

import textwrap

from diagnose.rewriters import rewrite
from harness.run import RunOptions, run_task
from harness.task import TaskSpec

HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"

# Triton's tutorial shape: configs from a helper written for another GPU, a grouped 1-D grid from META
TUTORIAL = HEADER + textwrap.dedent('''\
    def get_autotune_config():
        return [
            triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 4}, num_stages=2,
                          num_warps=2),
            triton.Config({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 4}, num_stages=3,
                          num_warps=2),
        ]


    @triton.autotune(configs=get_autotune_config(), key=["M", "N", "K"])
    @triton.jit
    def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
        pid = tl.program_id(0)
        num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
        num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
        group = pid // (GROUP_SIZE_M * num_pid_n)
        first_m = group * GROUP_SIZE_M
        size_m = min(num_pid_m - first_m, GROUP_SIZE_M)
        pid_m = first_m + (pid % (GROUP_SIZE_M * num_pid_n)) % size_m
        pid_n = (pid % (GROUP_SIZE_M * num_pid_n)) // size_m
        rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        rk = tl.arange(0, BLOCK_SIZE_K)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_SIZE_K):
            a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :], mask=(rm[:, None] < M) & ((k + rk)[None, :] < K),
                        other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :], mask=((k + rk)[:, None] < K) & (rn[None, :] < N),
                        other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


    def mm(a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), dtype=torch.float32, device=a.device)
        grid = lambda META: (triton.cdiv(M, META["BLOCK_SIZE_M"]) * triton.cdiv(N, META["BLOCK_SIZE_N"]),)
        mm_kernel[grid](a, b, c, M, N, K)
        return c
    ''')

# A module-level list, and a grid that does not follow the config: BLOCK must stay as it is
ROW_SCALE = HEADER + textwrap.dedent('''\
    CONFIGS = [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)]


    @triton.autotune(CONFIGS, key=["n"])
    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


    def scale(x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel())
        return out
    ''')


def _families(source: str, pattern: str = "block-size-num-warps") -> dict[str, str]:
    return {v.params["configs_added"]: v.source for v in rewrite(pattern, source, {})}


def test_a_helpers_config_list_gets_hopper_tiles_and_knob_neighbours_and_keeps_its_own(tmp_path):
    families = _families(TUTORIAL)
    assert set(families) == {"warps", "stages", "blocks", "hopper-tiles"}
    tiles = families["hopper-tiles"]
    assert "@triton.autotune(configs=get_autotune_config() + [\n" in tiles  # the helper's list, then the new
    # the wgmma tiles under the kernel's own key names, the other keys as in its first config
    assert ('triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 4}, '
            "num_warps=8, num_stages=4)") in tiles
    assert tiles.split("def get_autotune_config")[1].split("@triton.autotune")[0] == \
        TUTORIAL.split("def get_autotune_config")[1].split("@triton.autotune")[0]
    assert 'triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 4}, num_warps=4, ' \
           "num_stages=2)" in families["warps"]
    # every config the tuner may now pick computes the product (the judge pins each in turn)
    (tmp_path / "mm.py").write_text(TUTORIAL)
    spec = TaskSpec(kernel=str(tmp_path / "mm.py"), call="mm(torch.randn(40, 48), torch.randn(48, 36))",
                    reference="lambda a, b: a @ b")
    for family in ("blocks", "stages"):
        candidate = tmp_path / f"mm_{family}.py"
        candidate.write_text(families[family])
        report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(candidate),
                          candidate_entry="mm")
        assert report.run("candidate").correct, (family, report.to_dict())


def test_block_sizes_move_only_where_the_grid_follows_the_picked_config():
    families = _families(ROW_SCALE)
    assert set(families) == {"warps", "stages"}  # the grid divides by a literal 1024: BLOCK stays
    assert "@triton.autotune(CONFIGS + [\n" in families["warps"]  # a module-level list, given by position
    assert 'triton.Config({"BLOCK": 1024}, num_warps=16, num_stages=3)' in families["warps"]
    follows = ROW_SCALE.replace("scale_kernel[(triton.cdiv(x.numel(), 1024),)]",
                                'scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)]')
    assert 'triton.Config({"BLOCK": 2048}, num_warps=4, num_stages=3)' in _families(follows)["blocks"]


def test_a_cross_warp_finding_asks_for_fewer_warps_not_more():
    variants = rewrite("warp-local-reduction", ROW_SCALE, {})
    warps = next(v.source for v in variants if v.params["configs_added"] == "warps")
    assert 'triton.Config({"BLOCK": 1024}, num_warps=2, num_stages=3)' in warps and "num_warps=16" not in warps


def _with_configs(listed: str) -> str:
    """ROW_SCALE with `listed` as its configs, launched on a grid that follows the picked BLOCK."""
    source = ROW_SCALE.replace(
        'CONFIGS = [triton.Config({"BLOCK": 1024}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)]',
        f"CONFIGS = {listed}")
    return source.replace("scale_kernel[(triton.cdiv(x.numel(), 1024),)]",
                          'scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)]')


def test_a_comprehension_over_literals_is_read_as_the_configs_it_lists(tmp_path):
    """fla's and Liger's style: the list is a comprehension, one axis partly chosen at run time."""
    source = _with_configs('[triton.Config({"BLOCK": b}, num_warps=w, num_stages=s) for b in [512, 1024] '
                           'for w in [2, 4] + ([] if torch.cuda.is_available() else [8]) for s in range(2, 4)]')
    families = _families(source)
    assert set(families) == {"warps", "stages", "blocks"}
    warps = families["warps"]
    assert "@triton.autotune(CONFIGS + [\n" in warps  # the comprehension stays as it was, the new configs after it
    assert warps.split("\n")[5] == source.split("\n")[5]
    # 8 warps is listed on one branch only: still added (the other branch then times it twice); 16 from the 8
    assert 'triton.Config({"BLOCK": 512}, num_warps=8, num_stages=2)' in warps
    assert 'triton.Config({"BLOCK": 1024}, num_warps=16, num_stages=3)' in warps
    assert 'num_warps=4, num_stages=2)' not in warps  # surely listed already
    assert 'triton.Config({"BLOCK": 2048}, num_warps=2, num_stages=2)' in families["blocks"]
    # a grid too small for the device asks for smaller blocks, more programs
    smaller = {v.params["configs_added"]: v.source
               for v in rewrite("block-size-num-warps", source, {"finding": "parallelism.grid-underfilled"})}
    assert 'triton.Config({"BLOCK": 256}, num_warps=2, num_stages=2)' in smaller["blocks"]
    assert '"BLOCK": 2048' not in smaller["blocks"]
    # and the widened kernel computes the same under every config the tuner may pick
    (tmp_path / "scale.py").write_text(source)
    candidate = tmp_path / "scale_blocks.py"
    candidate.write_text(smaller["blocks"])
    spec = TaskSpec(kernel=str(tmp_path / "scale.py"), call="scale(torch.randn(3000))", reference="lambda x: x * 2.0")
    report = run_task(spec, RunOptions(backend="interpreter", time=False, seeds=1), candidate=str(candidate),
                      candidate_entry="scale")
    assert report.run("candidate").correct, report.to_dict()


def test_configs_it_cannot_read_are_kept_and_without_a_readable_one_it_declines():
    for unreadable in ('[triton.Config({"BLOCK": b}, num_warps=w) for b in sizes() for w in (4, 8)]',  # a call's values
                       '[triton.Config({"BLOCK": b}, num_warps=w) for b in (512, 1024) for w in (4, 8) if b * w < 8192]',
                       '[triton.Config({"BLOCK": b}, num_warps=4) for b in [n for n in (512, 1024)]]'):
        assert rewrite("block-size-num-warps", _with_configs(unreadable), {}) == [], unreadable
    hooked = ROW_SCALE.replace('num_warps=8)]', 'num_warps=8, pre_hook=print)]')
    (warps,) = [v.source for v in rewrite("block-size-num-warps", hooked, {}) if v.params["configs_added"] == "warps"]
    assert "pre_hook=print)" in warps and warps.count("pre_hook") == 1  # kept, never copied


def test_configs_whose_operand_buffers_cannot_fit_hopper_shared_memory_are_not_added():
    """The six measured Hopper tiles widened: stages + 1 at 128x256x64 and the doubled 256-wide blocks need
    more than sm90's 227 KiB for their 16-bit operand buffers alone, and would only be compiled to fail."""
    from diagnose.rewriters.configs import DOT_TILES, SHARED_LIMIT_SM90, dot_operand_bytes

    listed = "".join(f'\n        triton.Config({{"BLOCK_SIZE_M": {m}, "BLOCK_SIZE_N": {n}, "BLOCK_SIZE_K": {k}, '
                     f'"GROUP_SIZE_M": 4}}, num_stages={s}, num_warps={w}),' for m, n, k, s, w in DOT_TILES)
    hopper = TUTORIAL[:TUTORIAL.index("    return [") + len("    return [")] + listed + TUTORIAL[TUTORIAL.index("\n    ]\n"):]
    assert hopper.count("triton.Config(") == len(DOT_TILES)
    widened = {v.params["configs_added"]: v for v in rewrite("autotune-configs", hopper, {})}
    assert widened["stages"].params["count"] == 11 and widened["blocks"].params["count"] == 1  # of 12 and 6
    assert "hopper-tiles" not in widened  # the list holds them already
    for variant in widened.values():
        added = variant.source.split("get_autotune_config():")[1].split("@triton.autotune")[0]
        for line in added.splitlines():
            if "triton.Config(" in line and "num_stages" in line:
                m, n, k = (int(line.split(f'"BLOCK_SIZE_{r}": ')[1].split(",")[0]) for r in "MNK")
                stages = int(line.split("num_stages=")[1].split(",")[0])
                assert dot_operand_bytes(m, n, k, stages) <= SHARED_LIMIT_SM90, line
