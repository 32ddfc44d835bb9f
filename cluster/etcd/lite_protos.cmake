# cmake -DSRC=<go.etcd.io dir> -DOUT=<dir> -P lite_protos.cmake
#
# Copies etcd's rpc.proto, kv.proto and auth.proto to OUT as lite protos:
# without the gogoproto and google.api.http options (Go code generation and
# the JSON gateway, neither used here) and with optimize_for = LITE_RUNTIME.
# The daemon already links protobuf-lite for its own protocol; the full
# runtime alongside it would interpose on lite's symbols in the request path.
foreach(p etcd/etcdserver/etcdserverpb/rpc.proto etcd/mvcc/mvccpb/kv.proto
          etcd/auth/authpb/auth.proto)
  file(READ ${SRC}/${p} text)
  string(REGEX REPLACE "import \"(gogoproto/gogo|google/api/annotations)\\.proto\";" "" text
                       "${text}")
  string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;" "" text "${text}")
  string(REGEX REPLACE "additional_bindings {[^}]*}" "" text "${text}")
  string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {[^}]*};" "" text "${text}")
  string(REGEX MATCH "[^\n]*(gogoproto|google\\.api)[^\n]*" left "${text}")
  if(left)
    message(FATAL_ERROR "${p}: an option this script does not strip (${left})")
  endif()
  string(REGEX REPLACE "(package [a-z]+;)" "\\1\noption optimize_for = LITE_RUNTIME;" text
                       "${text}")
  get_filename_component(dir ${OUT}/${p} DIRECTORY)
  file(MAKE_DIRECTORY ${dir})
  file(WRITE ${OUT}/${p}.new "${text}")
  # Rewritten only when changed, so protoc does not rerun for nothing.
  file(COPY_FILE ${OUT}/${p}.new ${OUT}/${p} ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}/${p}.new)
endforeach()
