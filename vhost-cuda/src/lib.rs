//! vhost-cuda: a vhost-user backend that executes qcuda requests on the host GPU.
pub mod guest_buffer;
