# Sourced by the GPU batch scripts: CUDA-aware Open MPI over UCX with GPUDirect RDMA, and
# Horovod's GPU operations. Check the values against your cluster's documentation.

# Open MPI's UCX point-to-point layer: the one that moves GPU buffers (and uses GPUDirect RDMA
# over InfiniBand/RoCE). Change only if your Open MPI was built without UCX.
export OMPI_MCA_pml=ucx
# The openib BTL is obsolete next to UCX and only prints warnings.
export OMPI_MCA_btl=^openib
# UCX transports: rc (InfiniBand reliable connection), sm (shared memory), and the CUDA ones,
# which an explicit list must name or GPU buffers fall back to slow staging: cuda_copy (host
# <-> device copies), gdr_copy (low-latency GPUDirect copies, needs the gdrcopy module),
# cuda_ipc (GPU to GPU on one node over NVLink/PCIe). Drop gdr_copy if gdrcopy is not loaded.
export UCX_TLS=${UCX_TLS:-rc,sm,cuda_copy,gdr_copy,cuda_ipc}
# The HCA port to use; `ibv_devinfo` lists them. One rail per node is the simple default.
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-mlx5_0:1}
# Horovod's GPU operations (NCCL, or MPI over a CUDA-aware MPI) are fixed when Horovod is
# BUILT (HOROVOD_GPU_OPERATIONS=NCCL at build time, docs/gpu.md); no run-time variable changes
# them. Log what this installation has, so a CPU-only build is noticed before training.
python -c 'import horovod.torch as hvd; print(f"# horovod: cuda_built={hvd.cuda_built()} nccl_built={bool(hvd.nccl_built())}")' \
    || echo "# horovod: not importable (only --allreduce other than horovod will work)"
# NCCL: use GPUDirect RDMA when the GPU and the NIC share a PCIe switch or a CPU socket (PHB);
# lower it to PIX if transfers are slower with it, raise to SYS to force it.
export NCCL_NET_GDR_LEVEL=${NCCL_NET_GDR_LEVEL:-PHB}
