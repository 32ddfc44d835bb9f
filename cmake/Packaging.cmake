# Install rules for what no component owns (man pages, completion, docs,
# example sources) and the CPack .deb.
#
# The .deb is built from a tree configured with -DCMAKE_INSTALL_PREFIX=/usr
# (tests/package/package-test.sh does this), so that the configuration lands
# in /etc and the units in /usr/lib/systemd/system.
install(FILES docs/man/cxlpoold.8 docs/man/cxlpoolctl.8
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES docs/man/libcxlpool.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)
install(FILES tools/completion/cxlpoolctl.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME cxlpoolctl)
install(FILES README.md docs/architecture.md docs/daemon.md docs/protocol.md
              docs/topology-json.md docs/topology-kinds.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
install(FILES examples/cxlpool-example.c examples/cxlpool-example-cpp.cc
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

set(CPACK_PACKAGE_NAME cxlpool)
set(CPACK_PACKAGE_VENDOR "cxlpool developers")
set(CPACK_PACKAGE_CONTACT "cxlpool developers <cxlpool@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Node daemon, client library and CLI that pool host DRAM and CXL memory for GPUs")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libprotobuf-lite32")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "numactl, daxctl")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${PROJECT_SOURCE_DIR}/scripts/deb/conffiles ${PROJECT_SOURCE_DIR}/scripts/deb/postinst
    ${PROJECT_SOURCE_DIR}/scripts/deb/prerm ${PROJECT_SOURCE_DIR}/scripts/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
