# `cmake --install` puts packfeedd and packfeedctl in ${prefix}/bin (where
# deploy/systemd/packfeedd.service runs them from, prefix /usr/local), and the
# client library, its headers and packfeedConfig.cmake where a C++ trainer's
# find_package(packfeed) finds them:
#   find_package(packfeed CONFIG REQUIRED)
#   target_link_libraries(trainer PRIVATE packfeed::client)
# Only the client's public API is installed: its headers and the few of
# common/ they include, which need Abseil and nothing else. The transport,
# the protocol and gRPC live inside libpackfeed_client.so.
include(CMakePackageConfigHelpers)

set(PF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/packfeed)
install(TARGETS packfeed_client_shared
        EXPORT packfeedTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/common/include/packfeed/common/data_types.h
              ${PROJECT_SOURCE_DIR}/common/include/packfeed/common/defaults.h
              ${PROJECT_BINARY_DIR}/common/include/packfeed/common/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/packfeed/common)
install(EXPORT packfeedTargets NAMESPACE packfeed:: DESTINATION ${PF_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/packfeedConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/packfeedConfig.cmake
                              INSTALL_DESTINATION ${PF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/packfeedConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/packfeedConfig.cmake
              ${PROJECT_BINARY_DIR}/packfeedConfigVersion.cmake
        DESTINATION ${PF_CMAKE_DIR})
