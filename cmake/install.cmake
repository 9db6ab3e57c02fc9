# `cmake --install` puts packfeedd and packfeedctl in ${prefix}/bin (where
# deploy/systemd/packfeedd.service runs them from, prefix /usr/local), and the
# client library, its headers and packfeedConfig.cmake where a C++ trainer's
# find_package(packfeed) finds them:
#   find_package(packfeed CONFIG REQUIRED)
#   target_link_libraries(trainer PRIVATE packfeed::client)
include(CMakePackageConfigHelpers)

set(PF_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/packfeed)
install(TARGETS packfeed_common packfeed_proto packfeed_transport packfeed_client
        EXPORT packfeedTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(folder common transport client)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/include/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/common/include/packfeed/common/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/packfeed/common)
install(DIRECTORY ${PROJECT_BINARY_DIR}/proto/packfeed/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/packfeed
        FILES_MATCHING PATTERN "*.pb.h")
install(EXPORT packfeedTargets NAMESPACE packfeed:: DESTINATION ${PF_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/packfeedConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/packfeedConfig.cmake
                              INSTALL_DESTINATION ${PF_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/packfeedConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/packfeedConfig.cmake
              ${PROJECT_BINARY_DIR}/packfeedConfigVersion.cmake
        DESTINATION ${PF_CMAKE_DIR})
