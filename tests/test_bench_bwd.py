"""bench_bwd_sm90's problems on the CPU: its --problem spec (a chunk: sk= keys, more than the
queries), and one line with exit 2 for a bad one."""
import pytest

from lab.tools import bench_bwd_sm90 as bench


def test_problem_with_keys_of_its_own():
    assert bench.parse_problem("b=2,h=32,s=256,sk=8192,d=64") == (64, 256, False, (2, 32, 32, 8192))
    assert bench.parse_problem("b=2,h=32,kv=8,s=4096,d=128,causal") == (128, 4096, True, (2, 32, 8, 4096))


@pytest.mark.parametrize("spec,says", [("b=2,h=32,s=256,sk=0,d=64", "sk=0"), ("b=2,h=32,sk=256,d=64", "give b=, h=, s="),
                                       ("b=2,h=30,kv=8,s=256,d=64", "kv=8 must divide h=30")])
def test_a_bad_problem_is_one_line_and_exit_2(spec, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_problem(spec)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_variant_takes_dq_slices_as_an_integer(capsys):
    """The dq_slices predictions' command: --variants deterministic=true,dq_slices=2."""
    assert bench.parse_variant("deterministic=true,dq_slices=2") == {"deterministic": True, "dq_slices": 2}
    with pytest.raises(SystemExit) as e:
        bench.parse_variant("deterministic=true,dq_slices=two")
    assert e.value.code == 2 and "dq_slices=INTEGER" in capsys.readouterr().err
