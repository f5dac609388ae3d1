"""What Inductor generated, read from output code (compile/fusion.py): kernels with their fused ops and
user lines, extern calls and ATen fallbacks, in launch order."""

from __future__ import annotations

import json

from torchdoctor.compile import fusion

CODE = '''
cpp_fused_gelu_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r"""...""")
triton_poi_fused_add_cos_sin_0 = async_compile.triton('triton_poi_fused_add_cos_sin_0', """...""")

class Runner:
    def call(self, args):
        primals_1, primals_2 = args
        buf0 = empty_strided_cpu((8, 64), (64, 1), torch.float32)
        # Topologically Sorted Source Nodes: [input_1], Original ATen: [aten.t, aten.addmm]
        extern_kernels.addmm(primals_2, primals_1, out=buf0)
        cpp_fused_gelu_0(buf0, buf1)
        # Topologically Sorted Source Nodes: [sin, cos, add], Original ATen: [aten.sin, aten.cos, aten.add]
        triton_poi_fused_add_cos_sin_0.run(buf1, buf2, 512, stream=stream0)
        cpp_fused_gelu_0(buf2, buf3)
        buf4 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf3, buf3, buf3)
        return (buf4, )
'''


def test_launches_in_order_with_their_ops():
    got = fusion.parse(CODE)
    assert [(k["name"], k["aten"], k["nodes"], k["launches"]) for k in got["kernels"]] == [
        ("cpp_fused_gelu_0", ["gelu"], [], 2),  # no comment on a C++ launch: its ops from its name
        ("triton_poi_fused_add_cos_sin_0", ["sin", "cos", "add"], ["sin", "cos", "add"], 1)]
    assert [(e["name"], e["aten"], e["nodes"]) for e in got["externs"]] == [
        ("extern_kernels.addmm", ["t", "addmm"], ["input_1"]),
        ("aten._scaled_dot_product_flash_attention_for_cpu", ["_scaled_dot_product_flash_attention_for_cpu"], [])]


def test_kernel_names_split_back_into_op_names():
    assert fusion.ops_from_name("cpp_fused_gelu_gelu_backward_sum_0") == ["gelu", "gelu_backward", "sum"]
    assert fusion.ops_from_name("triton_per_fused_native_layer_norm_0") == ["native_layer_norm"]
    assert fusion.ops_from_name("cpp_fused__unsafe_view_add_clone_1") == ["unsafe_view", "add", "clone"]
    assert fusion.ops_from_name("cpp_fused_abs_add_max_mean_mul_0") == ["abs", "add", "max", "mean", "mul"]
    # nanoGPT's loss on a CPU (torch 2.14.1): "nll, loss, forward" before.
    assert fusion.ops_from_name("cpp_fused__log_softmax__unsafe_view_nll_loss_forward_view_6") == [
        "log_softmax", "unsafe_view", "nll_loss_forward", "view"]
    assert fusion.ops_from_name("cpp_fused__to_copy_mse_loss_smooth_l1_loss_backward_2") == [
        "to_copy", "mse_loss", "smooth_l1_loss_backward"]
    # PyG's compiled GIN on a CPU (torch 2.14.1): "relu_scatter, add" and "native_batch_norm, legit, no,
    # training" before.
    assert fusion.ops_from_name("cpp_fused_expand_index_select_new_zeros_relu_scatter_add_select_view_3") == [
        "expand", "index_select", "new_zeros", "relu", "scatter_add", "select", "view"]
    assert fusion.ops_from_name("cpp_fused__native_batch_norm_legit_no_training_relu_2") == [
        "native_batch_norm_legit_no_training", "relu"]
    assert fusion.ops_from_name("cpp_fused__native_batch_norm_legit_functional_copy__relu_2") == [
        "native_batch_norm_legit_functional", "copy", "relu"]
    assert fusion.ops_from_name("triton_poi_fused_add_slice_scatter_zeros_0") == ["add", "slice_scatter", "zeros"]
    assert fusion.ops_from_name("triton_poi_fused_select_backward_slice_scatter_add_1") == [
        "select_backward", "slice_scatter", "add"]


# torch 2.14.1 on a CPU (PyG's compiled GIN): fallbacks without "torch.ops.", and a comment written
# above a fallback, none above the C++ kernel that follows it.
CODE_214 = '''
class Runner:
    def call(self, args):
        buf60 = empty_strided_cpu((1, ), (1, ), torch.int64)
        # Topologically Sorted Source Nodes: [x_38], Original ATen: [aten.native_dropout]
        aten.randint.low_out(-9223372036854775808, 9223372036854775807, [1], out=buf60)
        buf0 = empty_strided_cpu((s77, 7), (7, 1), torch.float32)
        cpp_fused_add_copy__expand_index_select_new_zeros_relu_scatter_add_select_view_0(buf60, buf0, s77)
        aten.scatter_reduce_.two(buf0,0,buf1, reduce='sum', include_self=True)
        return (buf0, )
'''


def test_a_comment_belongs_to_the_next_launch_only():
    got = fusion.parse(CODE_214)
    (kernel,) = got["kernels"]
    assert kernel["nodes"] == [] and kernel["ops_from"] == "name"
    assert kernel["aten"] == ["add", "copy", "expand", "index_select", "new_zeros", "relu", "scatter_add", "select",
                              "view"]
    assert [(e["name"], e["aten"], e["nodes"], e.get("fallback")) for e in got["externs"]] == [
        ("aten.randint", ["native_dropout"], ["x_38"], True), ("aten.scatter_reduce_", ["scatter_reduce_"], [], True)]


# torch 2.14.1 on a CPU, pytorch/tutorials' compiled training step of a ResNet-18: each convolution is an
# assigned extern call under its comment, and the fused batch norm + ReLU after it has none.
CODE_214_CONV = '''
class Runner:
    def call(self, args):
        # Topologically Sorted Source Nodes: [out], Original ATen: [aten.convolution]
        buf26 = extern_kernels.convolution(buf24, buf2, stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False, output_padding=(0, 0), groups=1, bias=None)
        assert_tensor_metadata(buf26, (16, 64, 16, 16), (16384, 1, 1024, 64), torch.float32, 'torch.ops.aten.convolution.default')
        buf31 = empty_strided_cpu((16, 64, 16, 16), (16384, 1, 1024, 64), torch.float32)
        cpp_fused__native_batch_norm_legit_functional_copy__relu_2(buf26, primals_10, primals_11, buf27, buf31)
        return (buf31, )
'''


def test_an_assigned_extern_call_takes_its_comment():
    """The 20 convolutions were missed ('24 extern calls' instead of 44) and their comment went to the
    fused kernel after them: 'cpp_fused__native_batch_norm_legit_functional_copy__relu_2: convolution'."""
    got = fusion.parse(CODE_214_CONV)
    assert [(e["name"], e["aten"], e["nodes"]) for e in got["externs"]] == [
        ("extern_kernels.convolution", ["convolution"], ["out"])]
    (kernel,) = got["kernels"]
    assert kernel["ops_from"] == "name" and kernel["nodes"] == []
    assert kernel["aten"] == ["native_batch_norm_legit_functional", "copy", "relu"]


def test_a_run_s_report_ties_kernels_to_user_lines(tmp_path):
    (tmp_path / "output_code").mkdir()
    (tmp_path / "output_code" / "cabc.py").write_text(CODE)
    record = {"output_code": ["cabc.py"], "graphs": [{"ops": 5, "lines": {
        "input_1": "model.py:10", "sin": "model.py:12", "cos": "model.py:12", "add": "model.py:13", "gelu": "model.py:11"}}]}
    (m,) = fusion.report(str(tmp_path), record)
    triton = m["kernels"][1]
    assert triton["lines"] == ["model.py:12", "model.py:13"] and "lines_from" not in triton
    gelu = m["kernels"][0]
    assert gelu["lines"] == ["model.py:11"] and gelu["lines_from"] == "op names"
    assert m["externs"][0]["lines"] == ["model.py:10"]
    assert fusion.summary([m], 5) == ("1 compiled module(s), 5 captured ops -> 2 generated kernel(s) + 2 extern call(s) "
                                      "(addmm, aten._scaled_dot_product_flash_attention_for_cpu)")
    json.dumps(m)  # the report's JSON carries it as is
