/* Stand-in for NVIDIA's libcuda.so.1, the CUDA driver library that `docker run --runtime nvidia`
 * mounts into a container on a Jetson (docs/facts.md, "Thor realities": "`--runtime nvidia` is what
 * mounts the GPU libraries and devices into a container"; the seed's LD_PRELOAD names
 * /usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1). It only has to exist and load: the sim's torch
 * needs it (DT_NEEDED), so torch and vLLM import only where the nvidia runtime mounted it, as on a
 * Jetson (dusty-nv/jetson-containers#1397). There is no GPU behind it.
 *
 * Built with: gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stub.c
 */

typedef int CUresult;          /* CUDA_SUCCESS = 0 */

CUresult cuInit(unsigned int flags)
{
    (void)flags;
    return 0;
}

CUresult cuDriverGetVersion(int *version)
{
    if (version)
        *version = 13000;      /* CUDA 13.0, JetPack 7's driver API */
    return 0;
}
