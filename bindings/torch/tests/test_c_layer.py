"""tilejit_torch's ctypes layer (no torch, no GPU): the library loads with the ABI version the
structs restate, struct defaults come from the library, a valid call's checks pass, workspace sizes,
and bad arguments raise TilejitArgumentError with the library's message. Run by ctest
`torch_binding_c_layer` with TILEJIT_C_LIBRARY set to the built libtilejit_c.
"""
import ctypes
import importlib.util
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# the ctypes layer alone (the package's __init__ imports torch)
_spec = importlib.util.spec_from_file_location("tilejit_c_layer", os.path.join(HERE, "..", "tilejit_torch", "_c.py"))
c = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(c)

BASE = 0x7F0000000000  # fake, aligned device addresses: nothing here dereferences them


def contiguous(offset, dtype, sizes):
    strides, s = [], 1
    for n in reversed(sizes):
        strides.insert(0, s)
        s *= n
    return c.Tensor.make(BASE + offset, dtype, sizes, strides, 0)


class CLayer(unittest.TestCase):
    def setUp(self):
        self.q = contiguous(0, c.BF16, [2, 100, 8, 64])
        self.k = contiguous(0x1000000, c.BF16, [2, 300, 2, 64])
        self.v = contiguous(0x2000000, c.BF16, [2, 300, 2, 64])
        self.o = contiguous(0x3000000, c.BF16, [2, 100, 8, 64])
        self.lse = contiguous(0x4000000, c.F32, [2, 8, 100])

    def test_version_and_struct_layout(self):
        self.assertEqual(c.library().tilejit_c_abi_version(), c.ABI_VERSION)
        self.assertTrue(c.version())
        # the struct's size as C sees it: every field at C's offset (checked through the defaults
        # the library writes: a shifted field would show up as garbage here)
        o = c.Options()
        self.assertEqual((o.has_softmax_scale, o.causal, o.mask_kind, o.score_mod, o.dq_reduction, o.q_descending), (0, 0, 0, 0, 0, 0))
        self.assertEqual((o.dropout_p, o.seed, o.offset, o.max_seqlen_q), (0.0, 0, 0, 0))
        self.assertFalse(o.cu_seqlens_q or o.mask_doc_ids or o.block_mask or o.rng_state)
        self.assertEqual(ctypes.sizeof(c.Tensor), 8 + 4 + 4 + 32 + 32 + 4 + 4)  # (padded to 8)

    def test_valid_checks_and_workspace(self):
        o = c.Options()
        o.causal = 1
        c.check_forward(self.q, self.k, self.v, self.o, self.lse, o)
        self.assertGreaterEqual(c.backward_workspace_bytes(self.q, self.k, o), 4 * 2 * 8 * 100)  # Delta
        self.assertEqual(c.forward_workspace_bytes(self.q, self.k, o), 0)
        docs = contiguous(0x5000000, c.I32, [2, 300])
        o2 = c.Options()
        o2.mask_kind = c.MASK_DOCUMENT
        o2.set_tensor("mask_doc_ids", docs)
        self.assertGreater(c.forward_workspace_bytes(self.q, self.k, o2), 0)  # the block lists
        # dropout's seed and offset in device memory (i64 [2]): the checks take it
        o3 = c.Options()
        o3.dropout_p = 0.1
        o3.set_tensor("rng_state", contiguous(0x6000000, c.I64, [2]))
        c.check_forward(self.q, self.k, self.v, self.o, self.lse, o3)

    def test_bad_arguments(self):
        o = c.Options()
        k3 = contiguous(0x1000000, c.BF16, [2, 300, 3, 64])
        with self.assertRaises(c.TilejitArgumentError) as e:
            c.check_forward(self.q, k3, k3, self.o, self.lse, o)
        self.assertIn("multiple", str(e.exception))
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(c.TilejitArgumentError):
            c.Tensor.make(BASE, c.BF16, [1] * 5, [1] * 5, 0)
        o.dropout_p = 0.1
        o.set_tensor("rng_state", contiguous(0x6000000, c.I64, [3]))
        with self.assertRaisesRegex(c.TilejitArgumentError, r"options.rng_state has sizes \[3\] but must be \[2\]"):
            c.check_forward(self.q, self.k, self.v, self.o, self.lse, o)
        with self.assertRaisesRegex(c.TilejitArgumentError, "bits has sizes"):  # checked before any launch
            c.generate_dropout_bits(contiguous(0x7000000, c.U32, [16, 100, 9]), 2, 8, 100, 300, o, 0)

    def test_missing_library_is_a_clear_error(self):
        saved, saved_lib = os.environ.get("TILEJIT_C_LIBRARY"), c._lib
        try:
            os.environ["TILEJIT_C_LIBRARY"] = "/nonexistent/libtilejit_c.so"
            c._lib = None
            with self.assertRaisesRegex(OSError, "TILEJIT_C_LIBRARY"):
                c.library()
        finally:
            c._lib = saved_lib
            if saved is None:
                del os.environ["TILEJIT_C_LIBRARY"]
            else:
                os.environ["TILEJIT_C_LIBRARY"] = saved


if __name__ == "__main__":
    unittest.main()
