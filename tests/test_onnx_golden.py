"""The reference models export to exactly the bytes they did before the layer-protocol refactor
(SHA-256 recorded at commit 53c4499): refactoring the layers, the walker or the writer must not
change a single byte. A deliberate change to the exporter's output updates these digests in the
same commit, saying why.

GOLDEN pins the files since netcl writes its provenance (metadata_props: netcl.version,
netcl.input_layout, netcl.input_shape, netcl.architecture); GRAPH_GOLDEN the same files with the
metadata_props dropped, which are still the bytes recorded at 53c4499: provenance changed nothing else."""
import hashlib

import numpy as np
import pytest

import netcl
from netcl import models, nn
from netcl.io import export_onnx
from netcl.io import onnx_export as ox
from netcl.io.onnx_export import onnx_pb2 as P

GRAPH_GOLDEN = {
    "mlp-o17-fix": "1773e425bbdcf55f1a4d9ffe6b8a73239b93bade1f8c5087981f07cf363fcd7d",
    "mlp-o17-dyn": "214769456ae7a691e152e05fea0d7489a3606418aa8142d6936aa131b0c85829",
    "mlp-o13-dyn": "67bf58b91c84d7ee1a7ba83e246e63dd0b9c1d8b307051a84ec206bb267fa812",
    "mlp-o25-fix": "3f330a9cfde464fea30dc4ebb05c3fed1375b600a642699f788147524d7b667f",
    "cnn-o17-fix": "d3c8cd33f86a0731fc104fe9112736e4c8c35a810d813e24d871aac501e94316",
    "cnn-o17-dyn": "a7a712cb146092c44df6a8ff6197e299447595e9667ca0add2e859e407683abc",
    "cnn-o13-dyn": "a7fc2a6fbe5f61a2a892583c764ca652f7932eb2ead579c7c8f455abea3da309",
    "cnn-o25-fix": "c83942e7cc75b1a45437d3cea0a999b871b6c1e5dc3cc4f6fa0eeba2fb95be03",
    "detector26-o17-fix": "49e83297062edbe45925fd612f8ec598cf01e1d87b4da30d0ccef1aacdda181f",
    "detector26-o17-dyn": "3702c7026da0763405dc610b10a264219ec726ea2c13ae190a13d3ab9cbaafcc",
    "detector26-o13-dyn": "ad9d18d46662a3e57aed33736e6bfe54d2e0ffb77a0d154d772f2db4a09a2b72",
    "detector26-o25-fix": "50fc7795b3d3a6da7168f36fd5a39887a3d75b285e70ec8482830081673155b6",
    "mha-o17-dyn": "2e807aba432b7af5d6d1911231c389c3c352e38203ce05c0c28686caa2d137ac",
}

GOLDEN = {
    "cnn-o13-dyn": "cbfefb41b016151c9ca80a7b874a618867a4b6ecf28668b0dadb7fc996bb6d08",
    "cnn-o17-dyn": "21e5b8ec54d25b02b95ac7d29e505aa1cbeb2c8fb55435a29a85588956881e00",
    "cnn-o17-fix": "127a56334473fb5a9954368ae4523537a2582ab0f9b56750e592b66d2f5c6514",
    "cnn-o25-fix": "cc9490549981a843ab316a4df5ed6f2f5ad5a2b1a9c95ab73bf84baf4b5b75ef",
    "detector26-o13-dyn": "0d944727cf624cc508a16676e50a21faa4cc64e8793b591707b27dde18eaed6c",
    "detector26-o17-dyn": "34ee2da31a5a5bdcd0fccd5132b242bba72f857d1373a2b19899f72281bf5465",
    "detector26-o17-fix": "e3690007d70be27f9887e7a7f48f28da642608f1693e938c6557792a810d7322",
    "detector26-o25-fix": "373123209b50db8d3c2da7d2dd97340fa10bc6f05e18d37b5bd41c5ec2c502ad",
    "mha-o17-dyn": "5113234df6bd97f20a8f65b0302cbc77f3bba55ad2ffb809f99cfc7b035c6a39",
    "mlp-o13-dyn": "b50fd5174be8e795646ef2a637abc2bcf7bd2bb9cd9611e24d64af441ace7f5c",
    "mlp-o17-dyn": "d6704ca9b88aac11b0e799161ba0dd88f7a1908a868eb756df5e48d6707dd6e9",
    "mlp-o17-fix": "716f0ee7886357a33c2ef826cd6fa76cc289286f37c632b8f29244dbc262c926",
    "mlp-o25-fix": "7a583d90a7c186681bb03a74797a69297b2240691754fea19adbd090f196f4ae",
}


def _model(name):
    netcl.manual_seed(1234)
    if name == "mha":
        model = nn.Sequential(nn.Linear(8, 16), nn.MultiheadAttention(16, 4), nn.Softmax(dim=-1), nn.Dropout(0.1))
        return model, (2, 5, 8)
    model = models.build(name)
    rng = np.random.default_rng(7)
    for layer in model:
        if isinstance(layer, nn.BatchNorm2d):
            c = layer.num_features
            layer.running_mean.set_(rng.normal(0, .5, c))
            layer.running_var.set_(rng.uniform(.5, 2, c))
            layer.weight.set_(rng.uniform(.5, 1.5, c))
            layer.bias.set_(rng.normal(0, .2, c))
    return model, (2,) + models.MODELS[name].input_shape


@pytest.mark.parametrize("case", sorted(GRAPH_GOLDEN))
def test_reference_exports_are_byte_identical(case, tmp_path, monkeypatch):
    monkeypatch.setattr(ox, "__version__", "0.1.0")  # producer_version is part of the bytes
    name, opset, batch = case.rsplit("-", 2)
    model, shape = _model(name)
    path = tmp_path / "m.onnx"
    export_onnx(model.eval(), shape, path, opset=int(opset[1:]), dynamic_batch=batch == "dyn")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == GOLDEN[case]
    m = P.ModelProto.FromString(data)
    assert [p.key for p in m.metadata_props] == ["netcl.version", "netcl.input_layout", "netcl.input_shape",
                                                 "netcl.architecture"]
    del m.metadata_props[:]
    assert hashlib.sha256(m.SerializeToString()).hexdigest() == GRAPH_GOLDEN[case]
