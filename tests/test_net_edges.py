"""``backend/net_edges.py``: a converted net's edges in the runtime's plain Mat form, on ncnn
param text (that the nets then compute right is ``test_tokens.py``'s to show)."""

from autodice.backend.net_edges import batch_axes, keep_inputs, passed_on, plain_edges

# pnnx's test script beside a net, as it writes it (trimmed).
NCNN_PY = '''
        with net.create_extractor() as ex:
            ex.input("in0", ncnn.Mat(in0.numpy(), batch_index=0).clone())
            ex.input("in1", ncnn.Mat(in1.numpy(), batch_index=233).clone())

            _, out0 = ex.extract("out0")
            out.append(torch.from_numpy(out0.numpy(batch_index=0)))
'''

# Two inputs added, then a layer, as pnnx writes a net.
PARAM = """7767517
4 5
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
BinaryOp                 add_0                    2 1 in0 in1 2 0=0
Sigmoid                  sigmoid_0                1 1 2 out0
"""


def test_pnnx_says_each_edges_batch_axis_in_its_script():
    assert batch_axes(NCNN_PY) == ({0: 0, 1: 233}, {0: 0})


def test_a_batch_of_four_is_reshaped_from_and_to_one_mat_at_the_edges():
    got = plain_edges(PARAM, [(4, 3, 8), (4, 3, 8)], [0, 233], [(4, 3, 8)], [0])
    assert got == """7767517
6 7
Input                    in0                      0 1 in0
Reshape                  plain_in0                1 1 in0 in0_net 0=8 1=3 2=4 12=233 13=0
Input                    in1                      0 1 in1
BinaryOp                 add_0                    2 1 in0_net in1 2 0=0
Sigmoid                  sigmoid_0                1 1 2 out0_net
Reshape                  plain_out0               1 1 out0_net out0 0=8 1=3 2=4 12=0 13=233
"""


def test_edges_already_plain_are_left_alone():
    # A batch of one is the runtime's form (its 1 dropped); no batch on a 4x3x8 keeps 4 axes
    # of which the runtime drops none; an axis pnnx did not say stays as it is.
    assert plain_edges(PARAM, [(1, 3, 8), (4, 3, 8)], [0, 233], [(1, 3, 8)], [0]) == PARAM
    assert plain_edges(PARAM, [(4, 3, 8), (4, 3, 8)], [None, None], [(4, 3, 8)], [None]) \
        == PARAM


def test_a_leading_one_without_a_batch_is_kept_as_an_axis():
    """pnnx reads a 1x3x8 it finds no batch for as a 3-d Mat of one channel."""
    got = plain_edges(PARAM, [(1, 3, 8), (1, 3, 8)], [233, 0], [(1, 3, 8)], [0])
    assert "Reshape                  plain_in0                1 1 in0 in0_net 0=8 1=3 2=1 " \
           "12=233 13=233" in got
    assert "plain_in1" not in got and "plain_out0" not in got


def test_an_input_passed_straight_on_is_found_and_kept_under_its_name():
    param = """7767517
2 2
Input                    in0                      0 1 in0
Input                    in1                      0 1 out1
"""
    assert passed_on(param) == {1: 1}
    assert keep_inputs(param).splitlines()[-2:] == [
        "Input                    in1                      0 1 in1",
        "Noop                     noop_out1                1 1 in1 out1"]
