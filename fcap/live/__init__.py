"""A capture's life: resolve, load, attach, drain the buffers in time order, write, detach."""
