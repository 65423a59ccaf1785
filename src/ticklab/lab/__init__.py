"""The guest lab: lab kernels built from Debian's linux-source-6.12 with our patches, a guest image,
and QEMU boots that run the same experiment code inside a guest (docs/ARCHITECTURE.md, "The lab")."""
