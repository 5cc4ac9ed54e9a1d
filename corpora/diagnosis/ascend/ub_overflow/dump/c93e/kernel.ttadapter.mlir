module {
  func.func @softmax_kernel(%arg0: memref<?xi8>, %arg1: memref<?xi8>, %arg2: memref<?xf32> {tt.divisibility = 16 : i32, tt.tensor_kind = 0 : i32}, %arg3: memref<?xf32> {tt.divisibility = 16 : i32, tt.tensor_kind = 1 : i32}, %arg4: i32, %arg5: i32, %arg6: i32, %arg7: i32, %arg8: i32, %arg9: i32, %arg10: i32) attributes {SyncBlockLockArgIdx = 0 : i64, WorkspaceArgIdx = 1 : i64, global_kernel = "local", mix_mode = "aiv", parallel_mode = "simd"} {
    %cst = arith.constant 0xFF800000 : f32 loc(#loc1)
    %alloc = memref.alloc() : memref<65536xf32> loc(#loc2)
    linalg.fill ins(%cst : f32) outs(%alloc : memref<65536xf32>) loc(#loc2)
    %0 = bufferization.to_tensor %alloc restrict writable : memref<65536xf32> loc(#loc2)
    return loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
#loc1 = loc(unknown)
#loc2 = loc("kernel.py":8:8)
