//! `TensorMapEncode`: a tensor map encoded by the host's driver (`cuTensorMapEncodeTiled`,
//! `...Im2col`, `...Im2colWide`, `cuTensorMapReplaceAddress`). Nothing of the session is touched:
//! the map only describes memory, which a kernel later reaches under the device's own checks.

use qcuda_proto::tensor_map::{TensorMapRequest, TENSOR_MAP_REQUEST_SIZE, TENSOR_MAP_SIZE};

use super::*;

impl GpuState {
    pub(super) fn tensor_map_encode(&mut self, req: &Request) -> OpResult {
        let input = req.inputs().first().ok_or(status::INVALID_VALUE)?;
        let out = req.outputs().first().ok_or(status::INVALID_VALUE)?;
        if input.len() != TENSOR_MAP_REQUEST_SIZE || out.len() < TENSOR_MAP_SIZE {
            return Err(status::INVALID_VALUE.into());
        }
        let bytes = input.to_vec().map_err(|_| status::INVALID_VALUE)?;
        let r = TensorMapRequest::decode(&bytes).ok_or(status::INVALID_VALUE)?;
        let dev = self.bind_new(req)?;
        let map = self.drv.tensor_map(&r).map_err(on(dev))?;
        out.write_at(0, &map).map_err(|_| status::INVALID_VALUE)?;
        ok()
    }
}
