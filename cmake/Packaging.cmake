# Install rules for what no component owns: man pages, shell completion,
# docs and the example sources. Every destination is relative to the install
# prefix, so `cmake --install build --prefix P` writes only under P.
#
# The Debian packages (cxlpool, libcxlpool0, libcxlpool-dev and their
# -dbgsym) are built from debian/ with dpkg-buildpackage, which installs
# through these same rules: scripts/build-debs.sh (docs/service.md).
install(FILES docs/man/cxlpoold.8 docs/man/cxlpoolctl.8
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES docs/man/libcxlpool.3 DESTINATION ${CMAKE_INSTALL_MANDIR}/man3)
install(FILES tools/completion/cxlpoolctl.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME cxlpoolctl)
install(FILES README.md docs/architecture.md docs/daemon.md docs/protocol.md docs/service.md
              docs/topology-json.md docs/topology-kinds.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)
install(FILES examples/cxlpool-example.c examples/cxlpool-example-cpp.cc
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
