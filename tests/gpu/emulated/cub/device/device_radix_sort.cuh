/* The emulated device's CUB stand-in (standin.cuh). */
#pragma once
#include "../standin.cuh"
