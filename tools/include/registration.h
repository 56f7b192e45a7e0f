// What kernel-builder generates for a build; the no-Nix build (tools/build.py)
// supplies this copy so the binding compiles the same way under both.
#pragma once

#include <Python.h>

#define MAXSIM_CONCAT_(a, b) a##b
#define MAXSIM_CONCAT(a, b) MAXSIM_CONCAT_(a, b)
#define MAXSIM_STRINGIFY_(a) #a
#define MAXSIM_STRINGIFY(a) MAXSIM_STRINGIFY_(a)

#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)

// The extension module is empty: importing it only runs the static op registrations.
#define REGISTER_EXTENSION(NAME)                                                        \
  PyMODINIT_FUNC MAXSIM_CONCAT(PyInit_, NAME)(void) {                                   \
    static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, MAXSIM_STRINGIFY(NAME), \
                                            NULL, 0, NULL};                             \
    return PyModule_Create(&module_def);                                                \
  }
