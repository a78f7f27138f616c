//! Texture and surface object operations both API faces offer (see `runtime::streams`).

use crate::{
    core::{cuda_error::CudaResult, runtime::current},
    generated::{cudaResourceDesc, cudaResourceViewDesc, cudaTextureDesc},
};

/// `cudaCreateTextureObject`: array, mipmapped array, linear and pitch-2D resources.
pub fn create_texture(
    res: &cudaResourceDesc,
    tex: &cudaTextureDesc,
    view: Option<&cudaResourceViewDesc>,
) -> CudaResult<u64> {
    let (rt, d) = current()?;
    rt.objects.create_texture(&rt.session, d, res, tex, view)
}

/// `cudaCreateSurfaceObject`: over an array made with `cudaArraySurfaceLoadStore`.
pub fn create_surface(res: &cudaResourceDesc) -> CudaResult<u64> {
    let (rt, d) = current()?;
    rt.objects.create_surface(&rt.session, d, res)
}

/// `cudaDestroyTextureObject`/`cudaDestroySurfaceObject`: only objects this process made.
pub fn destroy(obj: u64, surface: bool) -> CudaResult<()> {
    let (rt, d) = current()?;
    rt.objects.destroy(&rt.session, d, obj, surface)
}

/// The resource an object was made from.
pub fn resource(obj: u64, surface: bool) -> CudaResult<cudaResourceDesc> {
    let (rt, _) = current()?;
    rt.objects.resource(obj, surface)
}

/// A texture object's texture descriptor.
pub fn texture(obj: u64) -> CudaResult<cudaTextureDesc> {
    let (rt, _) = current()?;
    rt.objects.texture(obj)
}

/// A texture object's view (all zero when it has none).
pub fn view(obj: u64) -> CudaResult<cudaResourceViewDesc> {
    let (rt, _) = current()?;
    rt.objects.view(obj)
}
